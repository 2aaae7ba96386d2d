/**
 * A live rewrite's provisional text: what the model has written past the last settled line, which the
 * server keeps in the document just before the lines it has not reached, and replaces as hunks settle.
 * The server says where it is (`specedit/provisional`); it is shown as pending (italic, on the inserted-line
 * background) until the next notification moves or clears it.
 */
import * as vscode from 'vscode';
import { LanguageClient } from 'vscode-languageclient/node';
import { coveredLines } from './preview';
import { ProvisionalParams } from './protocol';

export interface ProvisionalChange {
  uri: vscode.Uri;
  text?: string; // the text marked pending; undefined: none
  range?: vscode.Range; // where it is
}

export class ProvisionalMarks implements vscode.Disposable {
  private readonly ranges = new Map<string, vscode.Range>(); // uri -> the pending lines
  private readonly changes = new vscode.EventEmitter<ProvisionalChange>();
  readonly onDidChange = this.changes.event;
  private readonly pending = vscode.window.createTextEditorDecorationType({
    isWholeLine: true,
    fontStyle: 'italic',
    backgroundColor: new vscode.ThemeColor('diffEditor.insertedLineBackground'),
    overviewRulerColor: new vscode.ThemeColor('editorOverviewRuler.addedForeground'),
    overviewRulerLane: vscode.OverviewRulerLane.Left,
    after: { contentText: '  ✎ specedit is writing…', color: new vscode.ThemeColor('editorCodeLens.foreground') },
  });
  private readonly disposables: vscode.Disposable[] = [this.pending, this.changes];

  constructor() {
    this.disposables.push(vscode.window.onDidChangeVisibleTextEditors(() => this.render()));
  }

  /** The server's notification: marked when the document is at its version (a newer one follows soon). */
  show(client: LanguageClient, params: ProvisionalParams): void {
    const uri = client.protocol2CodeConverter.asUri(params.uri);
    const document = vscode.workspace.textDocuments.find((doc) => doc.uri.toString() === uri.toString());
    const range = params.range && document?.version === params.version ? client.protocol2CodeConverter.asRange(params.range) : undefined;
    if (range && document) {
      this.ranges.set(uri.toString(), range);
      this.changes.fire({ uri, text: document.getText(range), range });
    } else {
      this.clear(uri);
    }
    this.render();
  }

  /** Where `uri`'s pending text is (undefined: none). */
  get(uri: vscode.Uri): vscode.Range | undefined {
    return this.ranges.get(uri.toString());
  }

  clear(uri: vscode.Uri): void {
    if (this.ranges.delete(uri.toString())) {
      this.changes.fire({ uri });
      this.render();
    }
  }

  dispose(): void {
    this.disposables.forEach((disposable) => disposable.dispose());
  }

  private render(): void {
    for (const editor of vscode.window.visibleTextEditors) {
      const range = this.ranges.get(editor.document.uri.toString());
      editor.setDecorations(this.pending, range ? [coveredLines(range)] : []);
    }
  }
}
