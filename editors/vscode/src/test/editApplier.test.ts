/**
 * editApplier.ts in VS Code's real undo stack: the edits of one live rewrite are one undo step, and an
 * edit for an older version of the document is refused. The server is not needed: its applyEdit
 * requests are made here.
 */
import * as assert from 'assert';
import * as fs from 'fs';
import * as path from 'path';
import * as vscode from 'vscode';
import { LanguageClient } from 'vscode-languageclient/node';
import { createConverter } from 'vscode-languageclient/lib/common/protocolConverter';
import { ApplyWorkspaceEditParams } from 'vscode-languageclient';
import { EditApplier } from '../editApplier';

const client = { protocol2CodeConverter: createConverter(undefined, false, false) } as unknown as LanguageClient;

function replaceLine(document: vscode.TextDocument, line: number, text: string, version = document.version): ApplyWorkspaceEditParams {
  const range = { start: { line, character: 0 }, end: { line: line + 1, character: 0 } };
  return { edit: { documentChanges: [{ textDocument: { uri: document.uri.toString(), version }, edits: [{ range, newText: text }] }] } };
}

async function openFile(name: string, text: string): Promise<vscode.TextEditor> {
  const folder = vscode.workspace.workspaceFolders?.[0];
  assert.ok(folder);
  const file = path.join(folder.uri.fsPath, name);
  fs.writeFileSync(file, text);
  return vscode.window.showTextDocument(await vscode.workspace.openTextDocument(vscode.Uri.file(file)));
}

suite('the server edits of a rewrite are one undo step', () => {
  test('three edits of one live rewrite, undone at once', async () => {
    const editor = await openFile('undo_group.py', 'a = 1\nb = 2\nc = 3\n');
    const applier = new EditApplier();
    applier.open(editor.document.uri);
    for (const [line, text] of [[0, 'a = 10\n'], [1, 'b = 20\n'], [2, 'c = 30\n']] as const) {
      assert.deepStrictEqual(await applier.handle(client, replaceLine(editor.document, line, text)), { applied: true });
    }
    applier.close(editor.document.uri);
    assert.strictEqual(editor.document.getText(), 'a = 10\nb = 20\nc = 30\n');
    assert.strictEqual(applier.appliedCount(editor.document.uri), 3);
    await vscode.commands.executeCommand('undo');
    assert.strictEqual(editor.document.getText(), 'a = 1\nb = 2\nc = 3\n');
  });

  test('outside a rewrite, each edit is its own undo step', async () => {
    const editor = await openFile('undo_steps.py', 'a = 1\nb = 2\n');
    const applier = new EditApplier();
    await applier.handle(client, replaceLine(editor.document, 0, 'a = 10\n'));
    await applier.handle(client, replaceLine(editor.document, 1, 'b = 20\n'));
    await vscode.commands.executeCommand('undo');
    assert.strictEqual(editor.document.getText(), 'a = 10\nb = 2\n');
  });

  test('an edit for an older version is refused', async () => {
    const editor = await openFile('stale.py', 'a = 1\n');
    const stale = replaceLine(editor.document, 0, 'a = 2\n', editor.document.version - 1);
    assert.strictEqual((await new EditApplier().handle(client, stale)).applied, false);
    assert.strictEqual(editor.document.getText(), 'a = 1\n');
  });
});
