/**
 * What a live rewrite wrote as VS Code's own diff: on the left the document as it was (each written hunk's
 * old lines in place of its new ones, and none of the text still being written), on the right the
 * document itself. The lines the rewrite removed show there in full, as deleted lines, in red (under the
 * new ones where the diff is inline, as it is beside a document). It opens beside the document when a
 * rewrite first writes (`specedit.previewDiff`), or from a hunk's "− N lines"; it follows the writing and
 * closes once every hunk is kept or undone.
 */
import * as path from 'path';
import * as vscode from 'vscode';
import * as config from './config';
import { ORIGINAL_SCHEME, propose } from './previewDiff';
import { ProvisionalMarks } from './provisional';
import { WrittenHunks } from './written';

/** The left side's address for a document: the document's own address rides in the query. */
export function originalUri(document: vscode.Uri): vscode.Uri {
  return vscode.Uri.from({ scheme: ORIGINAL_SCHEME, path: document.path, query: document.toString() });
}

export class WrittenDiffs implements vscode.TextDocumentContentProvider, vscode.Disposable {
  private readonly contentChanged = new vscode.EventEmitter<vscode.Uri>();
  readonly onDidChange = this.contentChanged.event;
  private readonly shown = new Set<string>(); // documents whose written hunks opened (or were asked for) a diff
  private readonly disposables: vscode.Disposable[] = [this.contentChanged];

  constructor(
    private readonly written: WrittenHunks,
    private readonly provisional: ProvisionalMarks,
  ) {
    this.disposables.push(
      vscode.workspace.registerTextDocumentContentProvider(ORIGINAL_SCHEME, this),
      written.onDidChangeCodeLenses(() => void this.sync()),
      provisional.onDidChange((change) => this.refresh(change.uri)),
      vscode.workspace.onDidChangeTextDocument((event) => this.refresh(event.document.uri)),
    );
  }

  provideTextDocumentContent(uri: vscode.Uri): string {
    return this.original(vscode.Uri.parse(uri.query)) ?? '';
  }

  /** The document as it was before its written hunks (undefined: it is not open). */
  original(uri: vscode.Uri): string | undefined {
    const document = vscode.workspace.textDocuments.find((doc) => doc.uri.toString() === uri.toString());
    if (!document) return undefined;
    const span = (range: vscode.Range) => ({ start: document.offsetAt(range.start), end: document.offsetAt(range.end) });
    const hunks = [...(this.written.get(uri)?.hunks ?? [])].map(([id, hunk]) => ({ id, ...span(hunk.range), newText: hunk.oldText }));
    const pending = this.provisional.get(uri);
    if (pending) hunks.push({ id: -1, ...span(pending), newText: '' }); // not written yet: not in the old text
    return propose(document.getText(), hunks).text;
  }

  /** Opens the diff of `uri`'s written hunks beside it. */
  async open(uri: vscode.Uri): Promise<void> {
    this.shown.add(uri.toString());
    const title = `${path.basename(uri.path)} (before ↔ specedit's rewrite)`;
    await vscode.commands.executeCommand('vscode.diff', originalUri(uri), uri, title, {
      viewColumn: vscode.ViewColumn.Beside,
      preview: true,
      preserveFocus: true,
    });
  }

  dispose(): void {
    this.disposables.forEach((disposable) => disposable.dispose());
  }

  /** The left side of `uri`'s diff follows, if it is open (a closed one is not read again). */
  private refresh(uri: vscode.Uri): void {
    const original = originalUri(uri).toString();
    if (this.shown.has(uri.toString()) && vscode.workspace.textDocuments.some((doc) => doc.uri.toString() === original)) {
      this.contentChanged.fire(originalUri(uri));
    }
  }

  /** The written hunks changed: the left side follows, new ones open their diff, ended ones close it. */
  private async sync(): Promise<void> {
    for (const shown of this.shown) this.refresh(vscode.Uri.parse(shown));
    for (const editor of vscode.window.visibleTextEditors) {
      const uri = editor.document.uri;
      if (this.written.has(uri) && !this.shown.has(uri.toString()) && config.previewDiff(editor.document)) await this.open(uri);
    }
    for (const shown of [...this.shown]) {
      if (this.written.has(vscode.Uri.parse(shown))) continue;
      this.shown.delete(shown);
      const original = originalUri(vscode.Uri.parse(shown)).toString();
      const tabs = vscode.window.tabGroups.all.flatMap((group) => group.tabs);
      const diffs = tabs.filter((tab) => tab.input instanceof vscode.TabInputTextDiff && tab.input.original.toString() === original);
      if (diffs.length > 0) await vscode.window.tabGroups.close(diffs, true);
    }
  }
}
