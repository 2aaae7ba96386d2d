/** How previewed hunks follow the user's typing (preview.ts `mapRange`): no server needed. */
import * as assert from 'assert';
import * as vscode from 'vscode';
import { mapRange } from '../preview';

function change(startLine: number, startCharacter: number, endLine: number, endCharacter: number, text: string): vscode.TextDocumentContentChangeEvent {
  const range = new vscode.Range(startLine, startCharacter, endLine, endCharacter);
  return { range, text, rangeOffset: 0, rangeLength: 0 };
}

const show = (range: vscode.Range | undefined): string =>
  range ? `${range.start.line}:${range.start.character}-${range.end.line}:${range.end.character}` : 'touched';

suite('preview ranges follow typing', () => {
  const hunk = new vscode.Range(2, 0, 4, 0); // lines 2 and 3

  test('typing above moves the hunk by the lines it adds or removes', () => {
    assert.strictEqual(show(mapRange(hunk, change(0, 0, 0, 0, 'a\nb\n'))), '4:0-6:0');
    assert.strictEqual(show(mapRange(hunk, change(0, 0, 2, 0, ''))), '0:0-2:0'); // ends where the hunk starts
    assert.strictEqual(show(mapRange(hunk, change(1, 3, 1, 3, 'xyz'))), '2:0-4:0');
  });

  test('typing below, or right after its last line, leaves it', () => {
    assert.strictEqual(show(mapRange(hunk, change(4, 0, 4, 0, 'new line\n'))), '2:0-4:0');
    assert.strictEqual(show(mapRange(hunk, change(7, 1, 9, 0, ''))), '2:0-4:0');
  });

  test('typing inside it drops it', () => {
    assert.strictEqual(show(mapRange(hunk, change(3, 1, 3, 1, 'x'))), 'touched');
    assert.strictEqual(show(mapRange(hunk, change(1, 0, 3, 0, ''))), 'touched');
  });

  test('an insertion hunk (empty range) moves with typing before it and stays with typing after it', () => {
    const insertion = new vscode.Range(2, 0, 2, 0);
    assert.strictEqual(show(mapRange(insertion, change(0, 0, 0, 0, '\n'))), '3:0-3:0');
    assert.strictEqual(show(mapRange(insertion, change(2, 1, 2, 1, 'x'))), '2:0-2:0');
    assert.strictEqual(show(mapRange(insertion, change(1, 2, 2, 1, ''))), 'touched');
  });
});
