/**
 * `preview` delivery: the server's hunks shown on the document, not written, each with Accept / Reject.
 *
 * A hunk replaces whole lines. Its old lines get the "removed" background; its new text shows after
 * them (the first line, inline) and in full in the hover. A CodeLens above each hunk accepts or rejects
 * it. Ranges follow the user's typing; a hunk the user types into is dropped from the view (the server
 * would skip it anyway).
 */
import * as vscode from 'vscode';
import { HunkPayload } from './protocol';

export interface PreviewHunk {
  id: number;
  range: vscode.Range; // whole lines of the current document; empty: an insertion before range.start
  newText: string;
}

export interface PreviewSession {
  jobId: string;
  uri: vscode.Uri;
  hunks: Map<number, PreviewHunk>;
}

export const ACCEPT_HUNK = 'specedit.acceptHunk';
export const REJECT_HUNK = 'specedit.rejectHunk';

/** Per document, one rewrite's hunks, each with a pair of CodeLenses (`lenses`: title and command, its
 * arguments the document, the job and the hunk's id); the ranges follow the user's typing, and a session
 * ends with its last hunk. Subclasses draw the hunks (`render`) on every change. */
export abstract class HunkSessions<H extends { range: vscode.Range }, S extends { jobId: string; hunks: Map<number, H> }>
  implements vscode.CodeLensProvider, vscode.Disposable
{
  protected readonly sessions = new Map<string, S>();
  private readonly lensesChanged = new vscode.EventEmitter<void>();
  readonly onDidChangeCodeLenses = this.lensesChanged.event;
  protected readonly disposables: vscode.Disposable[] = [this.lensesChanged];

  constructor(private readonly lenses: [title: string, command: string][]) {
    this.disposables.push(
      vscode.workspace.onDidChangeTextDocument((event) => this.follow(event)),
      vscode.workspace.onDidCloseTextDocument((document) => this.clear(document.uri)),
      vscode.window.onDidChangeVisibleTextEditors(() => this.render()),
    );
  }

  get(uri: vscode.Uri): S | undefined {
    return this.sessions.get(uri.toString());
  }

  has(uri: vscode.Uri | undefined): boolean {
    return uri !== undefined && this.sessions.has(uri.toString());
  }

  /** Hunks no longer shown (accepted, rejected, kept, undone or skipped). */
  remove(uri: vscode.Uri, hunkIds: Iterable<number>): void {
    const session = this.sessions.get(uri.toString());
    if (!session) return;
    for (const id of hunkIds) session.hunks.delete(id);
    if (session.hunks.size === 0) this.sessions.delete(uri.toString());
    this.changed();
  }

  /** The document's hunks (only if they are `jobId`'s, when given) no longer shown. */
  clear(uri: vscode.Uri, jobId?: string): void {
    const session = this.sessions.get(uri.toString());
    if (session && (jobId === undefined || session.jobId === jobId)) {
      this.sessions.delete(uri.toString());
      this.changed();
    }
  }

  provideCodeLenses(document: vscode.TextDocument): vscode.CodeLens[] {
    const session = this.sessions.get(document.uri.toString());
    if (!session) return [];
    return [...session.hunks].flatMap(([id, hunk]) => {
      const at = new vscode.Range(hunk.range.start, hunk.range.start);
      const args = [document.uri.toString(), session.jobId, id];
      return this.lensesFor(session, hunk).map(([title, command]) => new vscode.CodeLens(at, { title, command, arguments: args }));
    });
  }

  dispose(): void {
    this.sessions.clear();
    this.disposables.forEach((disposable) => disposable.dispose());
  }

  protected changed(): void {
    this.render();
    this.lensesChanged.fire();
  }

  protected abstract render(): void;

  /** The CodeLenses above a hunk: the same for every hunk, unless a subclass says otherwise. */
  protected lensesFor(_session: S, _hunk: H): [title: string, command: string][] {
    return this.lenses;
  }

  private follow(event: vscode.TextDocumentChangeEvent): void {
    const session = this.sessions.get(event.document.uri.toString());
    if (!session || event.contentChanges.length === 0) return;
    followChanges(session.hunks, event.contentChanges);
    if (session.hunks.size === 0) this.sessions.delete(event.document.uri.toString());
    this.changed();
  }
}

export class Previews extends HunkSessions<PreviewHunk, PreviewSession> {
  private readonly removed = vscode.window.createTextEditorDecorationType({
    isWholeLine: true,
    backgroundColor: new vscode.ThemeColor('diffEditor.removedLineBackground'),
    overviewRulerColor: new vscode.ThemeColor('editorOverviewRuler.deletedForeground'),
    overviewRulerLane: vscode.OverviewRulerLane.Left,
  });
  private readonly added = vscode.window.createTextEditorDecorationType({
    after: { color: new vscode.ThemeColor('gitDecoration.addedResourceForeground'), margin: '0 0 0 2em' },
  });

  constructor() {
    super([
      ['$(check) Accept', ACCEPT_HUNK],
      ['$(close) Reject', REJECT_HUNK],
    ]);
    this.disposables.push(this.removed, this.added);
  }

  /** New hunks of a job (a newer job on the document replaces the older one's preview). */
  add(uri: vscode.Uri, jobId: string, hunks: HunkPayload[]): void {
    let session = this.sessions.get(uri.toString());
    if (!session || session.jobId !== jobId) {
      session = { jobId, uri, hunks: new Map() };
      this.sessions.set(uri.toString(), session);
    }
    for (const hunk of hunks) {
      const { start, end } = hunk.range;
      const range = new vscode.Range(start.line, start.character, end.line, end.character);
      session.hunks.set(hunk.id, { id: hunk.id, range, newText: hunk.newText });
    }
    this.changed();
  }

  protected changed(): void {
    super.changed();
    void vscode.commands.executeCommand('setContext', 'specedit.hasPreview', this.has(vscode.window.activeTextEditor?.document.uri));
  }

  protected render(): void {
    for (const editor of vscode.window.visibleTextEditors) {
      const session = this.sessions.get(editor.document.uri.toString());
      const removed: vscode.DecorationOptions[] = [];
      const added: vscode.DecorationOptions[] = [];
      for (const hunk of session?.hunks.values() ?? []) {
        const hover = new vscode.MarkdownString().appendMarkdown('**specedit** proposes:\n\n');
        hover.appendCodeblock(hunk.newText || '(delete these lines)', editor.document.languageId);
        const lastLine = lastLineOf(hunk.range);
        if (lastLine >= hunk.range.start.line) removed.push({ range: lineRange(hunk.range.start.line, lastLine), hoverMessage: hover });
        const anchor = lastLine >= hunk.range.start.line ? lastLine : Math.max(hunk.range.start.line - 1, 0);
        added.push({
          range: editor.document.lineAt(Math.min(anchor, editor.document.lineCount - 1)).range,
          hoverMessage: hover,
          renderOptions: { after: { contentText: summary(hunk.newText) } },
        });
      }
      editor.setDecorations(this.removed, removed);
      editor.setDecorations(this.added, added);
    }
  }
}

/** Moves each hunk's range with the changes (each in the coordinates the one before left); drops the
 * hunks a change touched. */
export function followChanges(
  hunks: Map<number, { range: vscode.Range }>,
  changes: readonly vscode.TextDocumentContentChangeEvent[],
): void {
  for (const change of changes) {
    for (const [id, hunk] of [...hunks]) {
      const moved = mapRange(hunk.range, change);
      if (moved) hunk.range = moved;
      else hunks.delete(id);
    }
  }
}

/**
 * `range` after `change`, or undefined when the change touched it. Changes that end where the range
 * starts move it; changes that start where it ends leave it.
 */
export function mapRange(range: vscode.Range, change: vscode.TextDocumentContentChangeEvent): vscode.Range | undefined {
  const touched = range.isEmpty
    ? change.range.start.isBefore(range.start) && change.range.end.isAfter(range.start)
    : change.range.start.isBefore(range.end) && change.range.end.isAfter(range.start);
  if (touched) return undefined;
  if (!range.isEmpty && change.range.start.isAfterOrEqual(range.end)) return range;
  if (change.range.start.isAfter(range.end)) return range;
  return new vscode.Range(mapPosition(range.start, change), mapPosition(range.end, change));
}

function mapPosition(position: vscode.Position, change: vscode.TextDocumentContentChangeEvent): vscode.Position {
  if (position.isBefore(change.range.end)) return position;
  const lines = change.text.split(/\r\n|\r|\n/);
  const endLine = change.range.start.line + lines.length - 1;
  if (position.line !== change.range.end.line) return position.translate(endLine - change.range.end.line);
  const endCharacter = (lines.length === 1 ? change.range.start.character : 0) + lines[lines.length - 1].length;
  return new vscode.Position(endLine, endCharacter + position.character - change.range.end.character);
}

/** The last line a whole-line range covers (a range ending at column 0 stops on the line before). */
function lastLineOf(range: vscode.Range): number {
  return range.end.character === 0 ? range.end.line - 1 : range.end.line;
}

/** The lines a whole-line range covers, for a whole-line decoration (an empty range: its own line). */
export function coveredLines(range: vscode.Range): vscode.Range {
  return lineRange(range.start.line, Math.max(lastLineOf(range), range.start.line));
}

function lineRange(first: number, last: number): vscode.Range {
  return new vscode.Range(first, 0, last, 0);
}

function summary(text: string): string {
  const lines = text.split('\n').filter((line, index, all) => line !== '' || index < all.length - 1);
  if (lines.length === 0) return '  ⟶ (deleted)';
  const more = lines.length > 1 ? `  (+${lines.length - 1} lines, hover to see)` : '';
  return `  ⟶ ${lines[0].trim()}${more}`;
}
