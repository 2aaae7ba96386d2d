/**
 * What a live (or final) rewrite wrote, kept marked after it ends: the inserted-line background and, above each
 * hunk, Keep / Undo. Undo asks the server to restore that hunk's original lines; Keep, or the next
 * rewrite of the document, only drops the mark. Ranges follow the user's typing; a hunk typed into is no
 * longer offered (the server would leave it alone anyway).
 */
import * as vscode from 'vscode';
import { LanguageClient } from 'vscode-languageclient/node';
import { coveredLines, followChanges } from './preview';
import { WrittenHunks as WrittenPayload } from './protocol';

export const KEEP_HUNK = 'specedit.keepHunk';
export const UNDO_HUNK = 'specedit.undoHunk';

interface Session {
  jobId: string;
  hunks: Map<number, { range: vscode.Range }>; // id -> the lines holding its new text now
}

export class WrittenHunks implements vscode.CodeLensProvider, vscode.Disposable {
  private readonly sessions = new Map<string, Session>();
  private readonly lensesChanged = new vscode.EventEmitter<void>();
  readonly onDidChangeCodeLenses = this.lensesChanged.event;
  private readonly mark = vscode.window.createTextEditorDecorationType({
    isWholeLine: true,
    backgroundColor: new vscode.ThemeColor('diffEditor.insertedLineBackground'),
    overviewRulerColor: new vscode.ThemeColor('editorOverviewRuler.addedForeground'),
    overviewRulerLane: vscode.OverviewRulerLane.Left,
  });
  private readonly disposables: vscode.Disposable[] = [this.mark, this.lensesChanged];

  constructor() {
    this.disposables.push(
      vscode.workspace.onDidChangeTextDocument((event) => this.follow(event)),
      vscode.workspace.onDidCloseTextDocument((document) => this.clear(document.uri)),
      vscode.window.onDidChangeVisibleTextEditors(() => this.render()),
    );
  }

  /** A rewrite ended with hunks written: marked, when the document is still at the version they are for. */
  show(client: LanguageClient, uri: vscode.Uri, jobId: string, written: WrittenPayload): void {
    const document = vscode.workspace.textDocuments.find((doc) => doc.uri.toString() === uri.toString());
    if (!document || document.version !== written.version || written.hunks.length === 0) return;
    const hunks = new Map(written.hunks.map((hunk) => [hunk.id, { range: client.protocol2CodeConverter.asRange(hunk.range) }]));
    this.sessions.set(uri.toString(), { jobId, hunks });
    this.changed();
  }

  get(uri: vscode.Uri): Session | undefined {
    return this.sessions.get(uri.toString());
  }

  has(uri: vscode.Uri | undefined): boolean {
    return uri !== undefined && this.sessions.has(uri.toString());
  }

  remove(uri: vscode.Uri, hunkIds: Iterable<number>): void {
    const session = this.sessions.get(uri.toString());
    if (!session) return;
    for (const id of hunkIds) session.hunks.delete(id);
    if (session.hunks.size === 0) this.sessions.delete(uri.toString());
    this.changed();
  }

  clear(uri: vscode.Uri): void {
    if (this.sessions.delete(uri.toString())) this.changed();
  }

  provideCodeLenses(document: vscode.TextDocument): vscode.CodeLens[] {
    const session = this.sessions.get(document.uri.toString());
    if (!session) return [];
    return [...session.hunks].flatMap(([id, { range }]) => {
      const at = new vscode.Range(range.start, range.start);
      const args = [document.uri.toString(), session.jobId, id];
      return [
        new vscode.CodeLens(at, { title: '$(check) Keep', command: KEEP_HUNK, arguments: args }),
        new vscode.CodeLens(at, { title: '$(discard) Undo', command: UNDO_HUNK, arguments: args }),
      ];
    });
  }

  dispose(): void {
    this.sessions.clear();
    this.disposables.forEach((disposable) => disposable.dispose());
  }

  private changed(): void {
    this.render();
    this.lensesChanged.fire();
  }

  private render(): void {
    for (const editor of vscode.window.visibleTextEditors) {
      const session = this.sessions.get(editor.document.uri.toString());
      editor.setDecorations(this.mark, [...(session?.hunks.values() ?? [])].map((hunk) => coveredLines(hunk.range)));
    }
  }

  private follow(event: vscode.TextDocumentChangeEvent): void {
    const session = this.sessions.get(event.document.uri.toString());
    if (!session || event.contentChanges.length === 0) return;
    followChanges(session.hunks, event.contentChanges);
    if (session.hunks.size === 0) this.sessions.delete(event.document.uri.toString());
    this.changed();
  }
}
