/**
 * What a live (or final) rewrite wrote, marked while it is written and after it ends, as a diff: the new
 * lines on the inserted-line background; where lines went, a red rule and, above the hunk, the removed
 * line itself or "− 45 lines" (the old lines in the hover, and in full as deleted lines in VS Code's diff:
 * writtenDiff.ts). VS Code gives extensions no virtual lines, and the document holds only what the server
 * knows, so the old lines are never written into it. Once the rewrite has ended each hunk also offers
 * Keep / Undo: Undo asks the server to restore its old lines; Keep, or the next rewrite of the document,
 * only drops the mark. Ranges follow the user's typing; a hunk typed into is no longer offered (the
 * server would leave it alone anyway).
 */
import * as vscode from 'vscode';
import { LanguageClient } from 'vscode-languageclient/node';
import { coveredLines, HunkSessions } from './preview';
import { WrittenHunks as WrittenPayload } from './protocol';

export const KEEP_HUNK = 'specedit.keepHunk';
export const UNDO_HUNK = 'specedit.undoHunk';
export const SHOW_REMOVED = 'specedit.showRemovedLines';

export interface WrittenHunk {
  range: vscode.Range; // the lines holding its new text now (empty: where the lines it removed were)
  oldText: string; // the lines it replaced
  newText: string;
}

interface Session {
  jobId: string;
  hunks: Map<number, WrittenHunk>;
  writing: boolean; // the rewrite still runs: its hunks are not offered for Keep / Undo yet
}

/** What the view shows of one written hunk (for the extension's API and its tests). */
export interface ShownHunk {
  id: number;
  line: number; // its first line now
  removed: string[]; // the old lines shown as removed
  added: number; // how many new lines are marked inserted
}

export class WrittenHunks extends HunkSessions<WrittenHunk, Session> {
  private readonly mark = vscode.window.createTextEditorDecorationType({
    isWholeLine: true,
    backgroundColor: new vscode.ThemeColor('diffEditor.insertedLineBackground'),
    overviewRulerColor: new vscode.ThemeColor('editorOverviewRuler.addedForeground'),
    overviewRulerLane: vscode.OverviewRulerLane.Left,
  });
  // A rule where removed lines were: above the hunk's first new line, or the line after a pure deletion.
  private readonly removed = vscode.window.createTextEditorDecorationType({
    isWholeLine: true,
    borderColor: new vscode.ThemeColor('editorGutter.deletedBackground'),
    borderStyle: 'solid',
    borderWidth: '2px 0 0 0',
    overviewRulerColor: new vscode.ThemeColor('editorOverviewRuler.deletedForeground'),
    overviewRulerLane: vscode.OverviewRulerLane.Left,
  });

  constructor() {
    super([
      ['$(check) Keep', KEEP_HUNK],
      ['$(discard) Undo', UNDO_HUNK],
    ]);
    this.disposables.push(this.mark, this.removed);
  }

  /** A rewrite's hunks as written (`writing`: it still runs), marked when the document is at the version
   * they are for; they replace the marks of its earlier reports. Returns whether they are shown. */
  show(client: LanguageClient, uri: vscode.Uri, jobId: string, written: WrittenPayload, writing = false): boolean {
    const document = vscode.workspace.textDocuments.find((doc) => doc.uri.toString() === uri.toString());
    if (!document || document.version !== written.version) return false;
    if (written.hunks.length === 0) {
      this.clear(uri, jobId);
      return true;
    }
    const hunks = new Map(
      written.hunks.map((hunk) => [
        hunk.id,
        // (`?? ''`: a server older than `oldText` sends none)
        { range: client.protocol2CodeConverter.asRange(hunk.range), oldText: hunk.oldText ?? '', newText: hunk.newText },
      ]),
    );
    this.sessions.set(uri.toString(), { jobId, hunks, writing });
    this.changed();
    return true;
  }

  /** `jobId` has ended: its hunks are offered for Keep / Undo. */
  finished(uri: vscode.Uri, jobId: string): void {
    const session = this.sessions.get(uri.toString());
    if (session?.jobId !== jobId || !session.writing) return;
    session.writing = false;
    this.changed();
  }

  /** What is shown of `uri`'s written hunks, in the order of the document. */
  shown(uri: vscode.Uri): ShownHunk[] {
    const hunks = [...(this.get(uri)?.hunks ?? [])].sort(([, a], [, b]) => a.range.start.compareTo(b.range.start));
    return hunks.map(([id, hunk]) => ({
      id,
      line: hunk.range.start.line,
      removed: splitLines(hunk.oldText),
      added: hunk.range.isEmpty ? 0 : coveredLines(hunk.range).end.line - hunk.range.start.line + 1,
    }));
  }

  protected lensesFor(session: Session, hunk: WrittenHunk): [title: string, command: string][] {
    const removed = splitLines(hunk.oldText);
    const lenses: [string, string][] = [];
    // One removed line is shown as itself; more as their count (all of them: its hover, its diff).
    if (removed.length === 1) lenses.push([`− ${clip(removed[0].trim())}`, SHOW_REMOVED]);
    else if (removed.length > 1) lenses.push([`− ${removed.length} lines`, SHOW_REMOVED]);
    return session.writing ? lenses : [...lenses, ...super.lensesFor(session, hunk)];
  }

  protected render(): void {
    for (const editor of vscode.window.visibleTextEditors) {
      const session = this.sessions.get(editor.document.uri.toString());
      const marks: vscode.DecorationOptions[] = [];
      const rules: vscode.DecorationOptions[] = [];
      for (const hunk of session?.hunks.values() ?? []) {
        const hover = diffHover(hunk);
        if (!hunk.range.isEmpty) marks.push({ range: coveredLines(hunk.range), hoverMessage: hover });
        if (hunk.oldText === '') continue;
        const line = Math.min(hunk.range.start.line, editor.document.lineCount - 1);
        rules.push({ range: new vscode.Range(line, 0, line, 0), hoverMessage: hover });
      }
      editor.setDecorations(this.mark, marks);
      editor.setDecorations(this.removed, rules);
    }
  }
}

/** The hunk as a unified diff: its old lines, then its new ones. */
function diffHover(hunk: WrittenHunk): vscode.MarkdownString {
  const lines = [...splitLines(hunk.oldText).map((line) => `- ${line}`), ...splitLines(hunk.newText).map((line) => `+ ${line}`)];
  return new vscode.MarkdownString().appendMarkdown('**specedit** wrote:\n\n').appendCodeblock(lines.join('\n'), 'diff');
}

/** Whole lines, without their line ends ("a\nb\n" -> ["a", "b"]; "" -> []). */
export function splitLines(text: string): string[] {
  if (text === '') return [];
  const lines = text.split(/\r\n|\r|\n/);
  if (lines[lines.length - 1] === '') lines.pop();
  return lines;
}

function clip(line: string, most = 60): string {
  return line.length > most ? `${line.slice(0, most - 1)}…` : line;
}
