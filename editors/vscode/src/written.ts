/**
 * What a live (or final) rewrite wrote, kept marked after it ends: the inserted-line background and, above each
 * hunk, Keep / Undo. Undo asks the server to restore that hunk's original lines; Keep, or the next
 * rewrite of the document, only drops the mark. Ranges follow the user's typing; a hunk typed into is no
 * longer offered (the server would leave it alone anyway).
 */
import * as vscode from 'vscode';
import { LanguageClient } from 'vscode-languageclient/node';
import { coveredLines, HunkSessions } from './preview';
import { WrittenHunks as WrittenPayload } from './protocol';

export const KEEP_HUNK = 'specedit.keepHunk';
export const UNDO_HUNK = 'specedit.undoHunk';

interface Session {
  jobId: string;
  hunks: Map<number, { range: vscode.Range }>; // id -> the lines holding its new text now
}

export class WrittenHunks extends HunkSessions<Session> {
  private readonly mark = vscode.window.createTextEditorDecorationType({
    isWholeLine: true,
    backgroundColor: new vscode.ThemeColor('diffEditor.insertedLineBackground'),
    overviewRulerColor: new vscode.ThemeColor('editorOverviewRuler.addedForeground'),
    overviewRulerLane: vscode.OverviewRulerLane.Left,
  });

  constructor() {
    super([
      ['$(check) Keep', KEEP_HUNK],
      ['$(discard) Undo', UNDO_HUNK],
    ]);
    this.disposables.push(this.mark);
  }

  /** A rewrite ended with hunks written: marked, when the document is still at the version they are for. */
  show(client: LanguageClient, uri: vscode.Uri, jobId: string, written: WrittenPayload): void {
    const document = vscode.workspace.textDocuments.find((doc) => doc.uri.toString() === uri.toString());
    if (!document || document.version !== written.version || written.hunks.length === 0) return;
    const hunks = new Map(written.hunks.map((hunk) => [hunk.id, { range: client.protocol2CodeConverter.asRange(hunk.range) }]));
    this.sessions.set(uri.toString(), { jobId, hunks });
    this.changed();
  }

  protected render(): void {
    for (const editor of vscode.window.visibleTextEditors) {
      const session = this.sessions.get(editor.document.uri.toString());
      editor.setDecorations(this.mark, [...(session?.hunks.values() ?? [])].map((hunk) => coveredLines(hunk.range)));
    }
  }
}
