/**
 * A preview as VS Code's own diff: the document on the left, the document with every previewed hunk in
 * place on the right (a read-only `specedit-proposed:` document), so the new code reads in full, under the
 * lines it replaces when the diff is inline (as it is beside a document, where space is short). On the
 * right, each hunk says which keys accept or reject it (they act on the hunk at the cursor there; VS Code
 * shows no CodeLens in a diff unless `diffEditor.codeLens` is on, when Accept / Reject show too). The
 * right side follows the preview as hunks arrive, are accepted or rejected and as the user types; the diff
 * opens beside the document when a preview starts (`specedit.previewDiff`), and closes when it ends.
 */
import * as path from 'path';
import * as vscode from 'vscode';
import * as config from './config';
import { ACCEPT_HUNK, Previews, PreviewHunk, REJECT_HUNK } from './preview';

export const PROPOSED_SCHEME = 'specedit-proposed';
export const ORIGINAL_SCHEME = 'specedit-original'; // writtenDiff.ts
export const SHOW_DIFF = 'specedit.showPreviewDiff';

/** The right side's address for a document: the document's own address rides in the query. */
export function proposedUri(document: vscode.Uri): vscode.Uri {
  return vscode.Uri.from({ scheme: PROPOSED_SCHEME, path: document.path, query: document.toString() });
}

/** The document a side of a diff shows (a preview's proposal, or what it was before a live rewrite); itself
 * when it is not one. */
export function documentUri(uri: vscode.Uri): vscode.Uri {
  return uri.scheme === PROPOSED_SCHEME || uri.scheme === ORIGINAL_SCHEME ? vscode.Uri.parse(uri.query) : uri;
}

/** `text` with each hunk's new text in place of its range, and the line of the result where each starts. */
export function propose(
  text: string,
  hunks: Iterable<{ id: number; start: number; end: number; newText: string }>,
): { text: string; lines: Map<number, number> } {
  const ordered = [...hunks].sort((a, b) => a.start - b.start || a.end - b.end);
  const pieces: string[] = [];
  const lines = new Map<number, number>();
  let at = 0;
  let line = 0;
  for (const hunk of ordered) {
    if (hunk.start < at) continue; // overlapping hunks do not happen; never write one twice
    const kept = text.slice(at, hunk.start);
    line += newlines(kept);
    lines.set(hunk.id, line);
    line += newlines(hunk.newText);
    pieces.push(kept, hunk.newText);
    at = hunk.end;
  }
  pieces.push(text.slice(at));
  return { text: pieces.join(''), lines };
}

function newlines(text: string): number {
  let count = 0;
  for (let index = text.indexOf('\n'); index !== -1; index = text.indexOf('\n', index + 1)) count++;
  return count;
}

export class PreviewDiffs implements vscode.TextDocumentContentProvider, vscode.CodeLensProvider, vscode.Disposable {
  private readonly contentChanged = new vscode.EventEmitter<vscode.Uri>();
  readonly onDidChange = this.contentChanged.event;
  private readonly lensesChanged = new vscode.EventEmitter<void>();
  readonly onDidChangeCodeLenses = this.lensesChanged.event;
  private readonly shown = new Set<string>(); // documents whose preview opened (or was asked for) a diff
  private readonly hint = vscode.window.createTextEditorDecorationType({
    after: {
      contentText: process.platform === 'darwin' ? '  specedit: ⌘⌥Y accept · ⌘⌥N reject' : '  specedit: Ctrl+Alt+Y accept · Ctrl+Alt+N reject',
      color: new vscode.ThemeColor('editorCodeLens.foreground'),
    },
  });
  private readonly disposables: vscode.Disposable[] = [this.contentChanged, this.lensesChanged, this.hint];

  constructor(private readonly previews: Previews) {
    this.disposables.push(
      vscode.workspace.registerTextDocumentContentProvider(PROPOSED_SCHEME, this),
      vscode.languages.registerCodeLensProvider({ scheme: PROPOSED_SCHEME }, this),
      previews.onDidChangeCodeLenses(() => void this.sync()),
      vscode.window.onDidChangeVisibleTextEditors(() => this.render()),
      vscode.workspace.onDidChangeTextDocument((event) => {
        if (event.document.uri.scheme === PROPOSED_SCHEME) this.render();
      }),
    );
  }

  provideTextDocumentContent(uri: vscode.Uri): string {
    return this.proposal(documentUri(uri))?.text ?? '';
  }

  provideCodeLenses(proposed: vscode.TextDocument): vscode.CodeLens[] {
    const uri = documentUri(proposed.uri);
    const session = this.previews.get(uri);
    const proposal = this.proposal(uri);
    if (!session || !proposal) return [];
    return [...proposal.lines].flatMap(([id, line]) => {
      const at = new vscode.Range(line, 0, line, 0);
      const args = [uri.toString(), session.jobId, id];
      return [
        new vscode.CodeLens(at, { title: '$(check) Accept', command: ACCEPT_HUNK, arguments: args }),
        new vscode.CodeLens(at, { title: '$(close) Reject', command: REJECT_HUNK, arguments: args }),
      ];
    });
  }

  /** Open the diff of `uri`'s preview beside it. */
  async open(uri: vscode.Uri): Promise<void> {
    this.shown.add(uri.toString());
    const title = `${path.basename(uri.path)} ↔ specedit's proposal`;
    await vscode.commands.executeCommand('vscode.diff', uri, proposedUri(uri), title, {
      viewColumn: vscode.ViewColumn.Beside,
      preview: true,
      preserveFocus: true,
    });
  }

  /** The previewed hunk at the cursor of a right side: its document and id. */
  hunkAt(editor: vscode.TextEditor): { uri: vscode.Uri; id: number } | undefined {
    if (editor.document.uri.scheme !== PROPOSED_SCHEME) return undefined;
    const uri = documentUri(editor.document.uri);
    const session = this.previews.get(uri);
    const proposal = this.proposal(uri);
    if (!session || !proposal) return undefined;
    const line = editor.selection.active.line;
    for (const [id, start] of proposal.lines) {
      const hunk = session.hunks.get(id);
      if (hunk && start <= line && line < start + Math.max(1, newlines(hunk.newText))) return { uri, id };
    }
    return undefined;
  }

  dispose(): void {
    this.disposables.forEach((disposable) => disposable.dispose());
  }

  /** The keys' hint on each hunk's first line, on the right side of every diff shown. */
  private render(): void {
    for (const editor of vscode.window.visibleTextEditors) {
      if (editor.document.uri.scheme !== PROPOSED_SCHEME) continue;
      const lines = this.proposal(documentUri(editor.document.uri))?.lines ?? new Map<number, number>();
      const last = editor.document.lineCount - 1;
      editor.setDecorations(
        this.hint,
        [...lines.values()].map((line) => editor.document.lineAt(Math.min(line, last)).range),
      );
    }
  }

  private proposal(uri: vscode.Uri): { text: string; lines: Map<number, number> } | undefined {
    const document = vscode.workspace.textDocuments.find((doc) => doc.uri.toString() === uri.toString());
    const session = this.previews.get(uri);
    if (!document) return undefined;
    const hunks = [...(session?.hunks.values() ?? [])].map((hunk: PreviewHunk) => ({
      id: hunk.id,
      start: document.offsetAt(hunk.range.start),
      end: document.offsetAt(hunk.range.end),
      newText: hunk.newText,
    }));
    return propose(document.getText(), hunks);
  }

  /** The previews changed: right sides follow, a new preview opens its diff, an ended one closes it. */
  private async sync(): Promise<void> {
    for (const document of vscode.workspace.textDocuments) {
      if (document.uri.scheme === PROPOSED_SCHEME) this.contentChanged.fire(document.uri);
    }
    this.lensesChanged.fire();
    for (const editor of vscode.window.visibleTextEditors) {
      const uri = editor.document.uri;
      if (this.previews.has(uri) && !this.shown.has(uri.toString()) && config.previewDiff(editor.document)) {
        await this.open(uri);
      }
    }
    for (const shown of [...this.shown]) {
      const uri = vscode.Uri.parse(shown);
      if (this.previews.has(uri)) continue;
      this.shown.delete(shown);
      const proposed = proposedUri(uri).toString();
      const tabs = vscode.window.tabGroups.all.flatMap((group) => group.tabs);
      const diffs = tabs.filter((tab) => tab.input instanceof vscode.TabInputTextDiff && tab.input.modified.toString() === proposed);
      if (diffs.length > 0) await vscode.window.tabGroups.close(diffs, true);
    }
  }
}
