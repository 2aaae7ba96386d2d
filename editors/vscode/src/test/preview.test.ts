/** How previewed hunks follow the user's typing (preview.ts `mapRange`): no server needed. */
import * as assert from 'assert';
import * as vscode from 'vscode';
import { mapRange } from '../preview';
import { propose } from '../previewDiff';

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

suite("a preview's proposal (the right side of its diff)", () => {
  test('each hunk in place, in the order of the text, and the line where each starts', () => {
    const text = 'a\nb\nc\nd\n';
    const { text: proposed, lines } = propose(text, [
      { id: 2, start: 6, end: 8, newText: '' }, // delete "d\n"
      { id: 0, start: 0, end: 2, newText: 'A1\nA2\n' }, // "a\n" -> two lines
      { id: 1, start: 4, end: 4, newText: 'new\n' }, // insert before "c"
    ]);
    assert.strictEqual(proposed, 'A1\nA2\nb\nnew\nc\n');
    assert.deepStrictEqual([...lines].sort(), [[0, 0], [1, 3], [2, 5]]);
  });

  test('no hunk: the text as it is', () => {
    assert.deepStrictEqual(propose('x\r\ny\r\n', []), { text: 'x\r\ny\r\n', lines: new Map() });
  });
});
