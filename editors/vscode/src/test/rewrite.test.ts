/**
 * The extension in a real VS Code, against the real specedit language server.
 *
 * scripts/vscode-test.sh sets `specedit.server.command` to `python -m specedit.lsp --engine inprocess
 * --model <a tiny GPT-2 that memorised a few rewrites>` (tests/conftest.py, MEMORISED_REWRITES), so each
 * rewrite below has one known answer. The cancel test switches to a tiny random model that never ends its
 * answer ($SPECEDIT_VSCODE_ENDLESS_MODEL). Everything waits on events (command results, the extension's
 * rewrite events, document changes), each with a timeout; nothing sleeps.
 */
import * as assert from 'assert';
import * as fs from 'fs';
import * as path from 'path';
import * as vscode from 'vscode';
import { checkServerCommand, ServerSetupError } from '../config';
import type { SpeceditApi } from '../extension';
import { proposedUri } from '../previewDiff';
import { NAMES, RewriteResult } from '../protocol';
import { originalUri } from '../writtenDiff';

const ADD = { before: 'def add(a, b):\n    return a + b\n', instruction: 'Rename add to plus.', after: 'def plus(a, b):\n    return a + b\n' };
const XY = { before: 'x = 1\ny = 2\n', instruction: 'Make y three.', after: 'x = 1\ny = 3\n' };
const EMOJI = { before: "print('héllo 🙂')\r\nz = 0\r\n", instruction: 'Set z to 5.', after: "print('héllo 🙂')\r\nz = 5\r\n" };
// tests/conftest.py's ECHOED_SKETCH: the model answers this sketch with the sketch itself.
const ECHO = {
  before: 'def add(a, b):\n    return a + b\n\n\nprint(add(1, 2))\n',
  sketch: '# ... existing code ...\n\ndef sub(a, b):\n    return a - b\n\n# ... existing code ...\n',
};
// tests/conftest.py's LINES_SKETCH: its lines say where it goes, and merge it without the model.
const LINES = {
  before: ECHO.before,
  sketch: 'def add(a, b):\n    return a - b\n\n# ... existing code ...\n',
  after: 'def add(a, b):\n    return a - b\n\n\nprint(add(1, 2))\n',
};
// tests/test_vscode.py's GUARDED_REWRITE: an answer that removes most of its region, on an instruction that
// asks for no removal (the server's guard: lsp/guard.py).
const GUARDED = {
  before: 'a = 1\nb = 2\nc = 3\nd = 4\ne = 5\nf = 6\ng = 7\nh = 8\n',
  instruction: 'Rename a to first.',
  after: 'first = 1\n',
};
const REWRITE_TIMEOUT_MS = 45_000;
const LOAD_TIMEOUT_MS = 150_000; // a server's start, its model loaded: on 2 busy cores, up to a minute

let api: SpeceditApi;
let fileNumber = 0;

/** A new file in the workspace with `text`, open in the active editor. */
async function openFile(text: string): Promise<vscode.TextEditor> {
  const folder = vscode.workspace.workspaceFolders?.[0];
  assert.ok(folder, 'the test runs in a workspace folder');
  const file = path.join(folder.uri.fsPath, `sample_${process.pid}_${++fileNumber}.py`);
  fs.writeFileSync(file, text);
  const document = await vscode.workspace.openTextDocument(vscode.Uri.file(file));
  return vscode.window.showTextDocument(document);
}

function within<T>(promise: Thenable<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms: ${what}`)), ms);
  });
  return Promise.race([Promise.resolve(promise), timeout]).finally(() => clearTimeout(timer));
}

async function rewriteFile(instruction: string, delivery: string, ms = REWRITE_TIMEOUT_MS): Promise<RewriteResult> {
  const result = await within(
    vscode.commands.executeCommand<RewriteResult | undefined>('specedit.rewriteFile', { instruction, delivery }),
    ms,
    `${delivery} rewrite "${instruction}"`,
  );
  assert.ok(result, 'the rewrite command returned no result (see the extension output)');
  return result;
}

async function lensTitles(editor: vscode.TextEditor): Promise<string[]> {
  const lenses = await vscode.commands.executeCommand<vscode.CodeLens[]>('vscode.executeCodeLensProvider', editor.document.uri);
  return lenses.filter((lens) => lens.command?.command.startsWith('specedit.')).map((lens) => `${lens.range.start.line}:${lens.command?.title}`);
}

/** Polls `condition` (a file to appear: no event tells) every 50 ms, up to `ms`. */
async function until(condition: () => boolean, ms: number, what: string): Promise<void> {
  const deadline = Date.now() + ms;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms: ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/** A screenshot of the workbench, saved by test-harness/drive.js (when $SPECEDIT_VSCODE_SCREENSHOTS is set). */
async function screenshot(name: string): Promise<void> {
  const folder = process.env.SPECEDIT_VSCODE_SCREENSHOTS;
  if (!folder) return;
  const file = path.join(folder, `${name}.png`);
  fs.rmSync(file, { force: true });
  await vscode.commands.executeCommand('notifications.hideToasts'); // earlier tests' messages
  await new Promise((resolve) => setTimeout(resolve, 1000)); // the workbench draws CodeLenses late
  console.log(`specedit-screenshot ${name}`);
  await until(() => fs.existsSync(file), 15_000, `the screenshot ${file}`);
}

async function undo(editor: vscode.TextEditor): Promise<void> {
  await vscode.window.showTextDocument(editor.document, editor.viewColumn);
  await vscode.commands.executeCommand('undo');
}

suite('specedit in VS Code', () => {
  suiteSetup(async function () {
    this.timeout(LOAD_TIMEOUT_MS);
    const extension = vscode.extensions.getExtension<SpeceditApi>('specedit.specedit');
    assert.ok(extension, 'the extension under test is loaded');
    api = await extension.activate();
    // The tests time rewrites, not the model's load: the server loads it as it starts (`loadOnStart`).
    await api.server.ready();
    await until(() => api.server.engine?.state === 'ready', LOAD_TIMEOUT_MS, 'the server loaded its model');
  });

  test('a live rewrite streams into the document and is one undo step', async () => {
    const editor = await openFile(ADD.before);
    const reports: number[] = [];
    const messages: string[] = [];
    const told: (string | undefined)[] = [];
    const provisional: (string | undefined)[] = [];
    const listener = api.onDidChangeRewrite((event) => {
      if (event.kind === 'report') reports.push(event.stats?.generated_tokens ?? 0);
      if (event.kind === 'report') messages.push(event.stats?.message ?? '');
      if (event.kind === 'provisional') provisional.push(event.provisional);
      if (event.kind === 'ended') told.push(event.told);
    });
    const result = await rewriteFile(ADD.instruction, 'live').finally(() => listener.dispose());
    assert.strictEqual(result.status, 'complete', result.message);
    assert.strictEqual(editor.document.getText(), ADD.after);
    assert.ok(reports.length > 0, 'progress was reported while rewriting');
    // What the notification said: where the rewrite was (the model loading, the file read), then lines.
    for (const message of messages) {
      assert.match(message, /^((starting|loading the model|reading the file) · \d+ s|\d+\/\d+ lines · ([\d.]+|…) tok\/s · \d+% accepted)$/);
    }
    // The new first line showed, marked pending, while it was being written; nothing is pending now.
    const shown = provisional.filter((text): text is string => text !== undefined);
    assert.ok(shown.length > 0, 'provisional text was marked');
    for (const text of shown) assert.ok(ADD.after.startsWith(text.replace(/\r?\n$/, '')), `pending: ${JSON.stringify(text)}`);
    assert.strictEqual(provisional.at(-1), undefined, 'the pending mark is gone at the end');
    assert.deepStrictEqual(told, ['specedit: done: 1 change written; Keep or Undo each.'], 'the end is said');
    await undo(editor);
    assert.strictEqual(editor.document.getText(), ADD.before, 'one undo takes the whole rewrite back');
  });

  test('a rewrite asked for as the server starts waits for it; meanwhile the status item says "loading the model"', async function () {
    this.timeout(LOAD_TIMEOUT_MS + REWRITE_TIMEOUT_MS);
    const editor = await openFile(XY.before);
    await api.server.stop();
    const texts: string[] = [];
    const status = api.status.onDidChange((text) => texts.push(text));
    // The client says it runs from the server's answer to initialize on, before it has sent the open
    // documents: a rewrite asked for then must not reach the server ahead of its document.
    const running = new Promise<void>((resolve) => {
      const listener = api.server.onDidChangeState((state) => state === 'running' && (listener.dispose(), resolve()));
    });
    const started = api.server.ready();
    await within(running, REWRITE_TIMEOUT_MS, 'the server runs');
    const result = await rewriteFile(XY.instruction, 'live', LOAD_TIMEOUT_MS).finally(() => status.dispose());
    await started;
    assert.strictEqual(result.status, 'complete', result.message);
    assert.strictEqual(editor.document.getText(), XY.after);
    // "loading the model" from the server's start, never "ready" (the bare name) before it is loaded.
    assert.strictEqual(texts[0], '$(loading~spin) specedit: loading the model', JSON.stringify(texts));
    const ready = texts.indexOf('$(sparkle) specedit');
    assert.ok(ready > 0 && texts.slice(0, ready).every((text) => text.startsWith('$(loading~spin)')), JSON.stringify(texts));
    assert.strictEqual(api.status.text, '$(sparkle) specedit');
  });

  test('a rewrite that changes nothing says so, in every delivery', async () => {
    for (const delivery of ['live', 'preview', 'final']) {
      const editor = await openFile(XY.after); // tests/conftest.py: the model answers it with itself
      const told: (string | undefined)[] = [];
      const listener = api.onDidChangeRewrite((event) => event.kind === 'ended' && told.push(event.told));
      const result = await rewriteFile(XY.instruction, delivery).finally(() => listener.dispose());
      assert.strictEqual(result.status, 'complete', result.message);
      assert.strictEqual(editor.document.getText(), XY.after);
      assert.deepStrictEqual(told, ['specedit: no changes.'], delivery);
    }
  });

  test('Reject after a live rewrite restores the original', async () => {
    const editor = await openFile(XY.before);
    assert.strictEqual((await rewriteFile(XY.instruction, 'live')).status, 'complete');
    assert.strictEqual(editor.document.getText(), XY.after);
    await vscode.commands.executeCommand('specedit.rejectRewrite');
    assert.strictEqual(editor.document.getText(), XY.before);
    assert.deepStrictEqual(await lensTitles(editor), [], 'nothing left to keep or undo');
  });

  test('after a live rewrite each written hunk offers Keep and Undo; Undo at the cursor restores it', async () => {
    const editor = await openFile(XY.before);
    assert.strictEqual((await rewriteFile(XY.instruction, 'live')).status, 'complete');
    assert.deepStrictEqual(await lensTitles(editor), ['1:− y = 2', '1:$(check) Keep', '1:$(discard) Undo']);
    editor.selection = new vscode.Selection(0, 0, 0, 0);
    assert.ok(await vscode.commands.executeCommand('specedit.nextHunk'), 'the next hunk is on line 2');
    assert.strictEqual(editor.selection.active.line, 1);
    await screenshot('vscode-written-hunks');
    const undone = await vscode.commands.executeCommand<{ applied: number[] }>('specedit.rejectHunkAtCursor');
    assert.strictEqual(undone?.applied.length, 1);
    assert.strictEqual(editor.document.getText(), XY.before);
    assert.deepStrictEqual(await lensTitles(editor), [], 'the undone hunk is no longer offered');
  });

  test('a live rewrite shows the lines it removed, above the change and in a diff, until kept', async () => {
    const editor = await openFile(XY.before);
    const result = await rewriteFile(XY.instruction, 'live');
    assert.strictEqual(result.status, 'complete', result.message);
    // The hunk on line 2, its old line shown as removed above it, and the document as it was on the left of
    // a diff beside it. (Each report of a longer rewrite redraws the same while it writes.)
    const shown = api.written.shown(editor.document.uri).map((hunk) => `${hunk.line}:${hunk.removed.join('|')}:+${hunk.added}`);
    assert.deepStrictEqual(shown, ['1:y = 2:+1']);
    assert.deepStrictEqual(await lensTitles(editor), ['1:− y = 2', '1:$(check) Keep', '1:$(discard) Undo']);
    const original = originalUri(editor.document.uri).toString();
    const diffTab = () =>
      vscode.window.tabGroups.all
        .flatMap((group) => group.tabs)
        .find((tab) => tab.input instanceof vscode.TabInputTextDiff && tab.input.original.toString() === original);
    await until(() => diffTab() !== undefined, 10_000, 'the diff of what it wrote opened beside the document');
    assert.strictEqual((await vscode.workspace.openTextDocument(vscode.Uri.parse(original))).getText(), XY.before);
    assert.strictEqual(vscode.window.activeTextEditor?.document.uri.toString(), editor.document.uri.toString(), 'focus stays');
    await screenshot('vscode-live-diff');
    // Accept keeps it: the marks and the diff go, the text stays.
    await vscode.window.showTextDocument(editor.document, editor.viewColumn);
    await vscode.commands.executeCommand('specedit.acceptRewrite');
    assert.deepStrictEqual(await lensTitles(editor), []);
    assert.strictEqual(editor.document.getText(), XY.after);
    await until(() => diffTab() === undefined, 10_000, 'the diff closed once the hunk was kept');
  });

  test('the view follows a live rewrite to where it writes', async () => {
    const editor = await openFile('pass\n'.repeat(100) + XY.before);
    editor.selection = new vscode.Selection(100, 0, 101, 5); // selected, not scrolled to
    const inView = (line: number) => editor.visibleRanges.some((range) => range.start.line <= line && line <= range.end.line);
    assert.ok(!inView(101), 'the lines to rewrite start out of view');
    const result = await within(
      vscode.commands.executeCommand<RewriteResult>('specedit.rewriteSelection', { instruction: XY.instruction, delivery: 'live' }),
      REWRITE_TIMEOUT_MS,
      'rewrite of lines out of view',
    );
    assert.strictEqual(result?.status, 'complete', result?.message);
    assert.strictEqual(editor.document.lineAt(101).text, 'y = 3');
    await until(() => inView(101), 5_000, 'the written line in view');
  });

  test('a rewrite starts with no selection over the lines it rewrites', async () => {
    const editor = await openFile(ADD.before);
    editor.selection = new vscode.Selection(0, 4, 1, 3);
    const selections: string[] = [];
    const listener = api.onDidChangeRewrite((event) => {
      const { start, end } = editor.selection;
      if (event.kind === 'started') selections.push(`${start.line}:${start.character}-${end.line}:${end.character}`);
    });
    const result = await within(
      vscode.commands.executeCommand<RewriteResult>('specedit.rewriteSelection', { instruction: ADD.instruction, delivery: 'live' }),
      REWRITE_TIMEOUT_MS,
      'rewrite of the selection',
    ).finally(() => listener.dispose());
    assert.strictEqual(result?.status, 'complete', result?.message);
    assert.deepStrictEqual(selections, ['0:0-0:0'], 'a cursor where the rewrite starts');
  });

  test('Rewrite File (Preview) and Rewrite Selection (Preview) preview whatever the delivery setting says', async () => {
    assert.strictEqual(vscode.workspace.getConfiguration('specedit').get('delivery'), 'live');
    const editor = await openFile(XY.before);
    const result = await within(
      vscode.commands.executeCommand<RewriteResult>('specedit.rewriteFilePreview', { instruction: XY.instruction }),
      REWRITE_TIMEOUT_MS,
      'Rewrite File (Preview)',
    );
    assert.strictEqual(result?.status, 'complete', result?.message);
    assert.strictEqual(editor.document.getText(), XY.before, 'a preview writes nothing');
    assert.deepStrictEqual(await lensTitles(editor), ['1:$(check) Accept', '1:$(close) Reject']);
    await vscode.commands.executeCommand('specedit.rejectRewrite');

    const selection = await openFile(ADD.before);
    selection.selection = new vscode.Selection(0, 0, 1, 3);
    const selected = await within(
      vscode.commands.executeCommand<RewriteResult>('specedit.rewriteSelectionPreview', { instruction: ADD.instruction, delivery: 'live' }),
      REWRITE_TIMEOUT_MS,
      'Rewrite Selection (Preview)',
    );
    assert.strictEqual(selected?.status, 'complete', selected?.message);
    assert.strictEqual(selection.document.getText(), ADD.before, 'a preview writes nothing');
    assert.deepStrictEqual(await lensTitles(selection), ['0:$(check) Accept', '0:$(close) Reject']);
    await vscode.commands.executeCommand('specedit.rejectRewrite');
  });

  test('a live rewrite whose answer removes most of the code is not written: a preview, said in one line', async () => {
    const editor = await openFile(GUARDED.before);
    const told: (string | undefined)[] = [];
    const listener = api.onDidChangeRewrite((event) => event.kind === 'ended' && told.push(event.told));
    const result = await rewriteFile(GUARDED.instruction, 'live').finally(() => listener.dispose());
    assert.strictEqual(result.status, 'complete', result.message);
    assert.strictEqual(result.delivery, 'preview');
    assert.strictEqual(editor.document.getText(), GUARDED.before, 'nothing is left written');
    assert.deepStrictEqual(told, ['specedit: shown as a preview: it removes 7 of 8 lines. Accept or Reject.']);
    assert.ok((await lensTitles(editor)).includes('0:$(check) Accept'), 'offered as a preview');
    assert.deepStrictEqual(await lensTitles(editor).then((titles) => titles.filter((title) => title.includes('Keep'))), []);
    await screenshot('vscode-guarded');
    const accepted = await vscode.commands.executeCommand<{ applied: number[]; skipped: number[] }>('specedit.acceptRewrite');
    assert.deepStrictEqual(accepted?.skipped, []);
    assert.strictEqual(editor.document.getText(), GUARDED.after, 'Accept writes what was offered');
  });

  test('a live rewrite of a CRLF file with characters outside the BMP keeps its line ends', async () => {
    // UTF-16 positions (VS Code's) after an emoji, and the original's CRLF kept in the new lines.
    const editor = await openFile(EMOJI.before);
    assert.strictEqual(editor.document.eol, vscode.EndOfLine.CRLF);
    assert.strictEqual((await rewriteFile(EMOJI.instruction, 'live')).status, 'complete');
    assert.strictEqual(editor.document.getText(), EMOJI.after);
  });

  test('a rewrite of the selection', async () => {
    const editor = await openFile(ADD.before);
    editor.selection = new vscode.Selection(0, 4, 1, 3); // any part of the two lines: rewrites whole lines
    const result = await within(
      vscode.commands.executeCommand<RewriteResult>('specedit.rewriteSelection', { instruction: ADD.instruction, delivery: 'live' }),
      REWRITE_TIMEOUT_MS,
      'rewrite of the selection',
    );
    assert.strictEqual(result?.status, 'complete');
    assert.strictEqual(editor.document.getText(), ADD.after);
  });

  test('an edit sketch from the clipboard whose answer is not a merge is never applied', async () => {
    const editor = await openFile(ECHO.before);
    await vscode.env.clipboard.writeText(ECHO.sketch);
    for (const delivery of ['preview', 'live'] as const) {
      const args = delivery === 'live' ? { delivery } : undefined; // preview: the command's default
      const result = await within(
        vscode.commands.executeCommand<RewriteResult>('specedit.applySketch', args),
        REWRITE_TIMEOUT_MS,
        `apply sketch (${delivery})`,
      );
      assert.strictEqual(result?.status, 'error', JSON.stringify(result));
      assert.match(result?.message ?? '', /not a merge of the edit sketch: it still holds elision markers/);
      assert.strictEqual(editor.document.getText(), ECHO.before, `${delivery}: the document is as it was`);
    }
  });

  test('an edit sketch whose lines say where it goes is previewed, then accepted', async () => {
    const editor = await openFile(LINES.before);
    await vscode.env.clipboard.writeText(LINES.sketch);
    const result = await within(
      vscode.commands.executeCommand<RewriteResult>('specedit.applySketch'),
      REWRITE_TIMEOUT_MS,
      'apply sketch merged by its lines',
    );
    assert.strictEqual(result?.status, 'complete', JSON.stringify(result));
    assert.strictEqual(result?.stats?.merge, 'lines');
    assert.strictEqual(editor.document.getText(), LINES.before, 'a preview writes nothing');
    const accepted = await vscode.commands.executeCommand<{ applied: number[]; skipped: number[] }>('specedit.acceptRewrite');
    assert.deepStrictEqual(accepted?.skipped, []);
    assert.strictEqual(editor.document.getText(), LINES.after);
  });

  test('a preview changes nothing until accepted, and Accept is one undo step', async () => {
    const editor = await openFile(XY.before);
    const result = await rewriteFile(XY.instruction, 'preview');
    assert.strictEqual(result.status, 'complete', result.message);
    assert.strictEqual(editor.document.getText(), XY.before, 'a preview writes nothing');
    assert.deepStrictEqual(await lensTitles(editor), ['1:$(check) Accept', '1:$(close) Reject']);
    await screenshot('vscode-preview');
    const accepted = await vscode.commands.executeCommand<{ applied: number[]; skipped: number[] }>('specedit.acceptRewrite');
    assert.deepStrictEqual(accepted?.skipped, []);
    assert.strictEqual(editor.document.getText(), XY.after);
    assert.deepStrictEqual(await lensTitles(editor), [], 'no CodeLens left once accepted');
    await undo(editor);
    assert.strictEqual(editor.document.getText(), XY.before);
  });

  test('a preview follows typing above it, and Accept writes where the hunk went', async () => {
    const editor = await openFile(XY.before);
    assert.strictEqual((await rewriteFile(XY.instruction, 'preview')).status, 'complete');
    assert.ok(await editor.edit((edit) => edit.insert(new vscode.Position(0, 0), '# typed meanwhile\n')));
    assert.deepStrictEqual(await lensTitles(editor), ['2:$(check) Accept', '2:$(close) Reject']);
    const accepted = await vscode.commands.executeCommand<{ applied: number[]; skipped: number[] }>('specedit.acceptRewrite');
    assert.deepStrictEqual(accepted?.skipped, []);
    assert.strictEqual(editor.document.getText(), '# typed meanwhile\n' + XY.after);
  });

  test("a previewed hunk accepted through its CodeLens", async () => {
    const editor = await openFile(ADD.before);
    assert.strictEqual((await rewriteFile(ADD.instruction, 'preview')).status, 'complete');
    const lenses = await vscode.commands.executeCommand<vscode.CodeLens[]>('vscode.executeCodeLensProvider', editor.document.uri);
    const accept = lenses.find((lens) => lens.command?.command === 'specedit.acceptHunk')?.command;
    assert.ok(accept, 'an Accept CodeLens on the hunk');
    await vscode.commands.executeCommand(accept.command, ...(accept.arguments ?? []));
    assert.strictEqual(editor.document.getText(), ADD.after);
  });

  test("a preview's diff shows the new code in full beside the document, with Accept / Reject on each change", async () => {
    const editor = await openFile(EMOJI.before);
    const proposed = proposedUri(editor.document.uri);
    const diffTab = () =>
      vscode.window.tabGroups.all
        .flatMap((group) => group.tabs)
        .find((tab) => tab.input instanceof vscode.TabInputTextDiff && tab.input.modified.toString() === proposed.toString());
    assert.strictEqual((await rewriteFile(EMOJI.instruction, 'preview')).status, 'complete');
    await until(() => diffTab() !== undefined, 10_000, 'the diff opened beside the document');
    const right = await vscode.workspace.openTextDocument(proposed);
    assert.strictEqual(right.getText(), EMOJI.after, 'the right side: the document with the change in place');
    assert.strictEqual(editor.document.getText(), EMOJI.before, 'a preview writes nothing');
    assert.strictEqual(vscode.window.activeTextEditor?.document.uri.toString(), editor.document.uri.toString(), 'focus stays');
    const lenses = await vscode.commands.executeCommand<vscode.CodeLens[]>('vscode.executeCodeLensProvider', proposed);
    const titles = lenses.map((lens) => `${lens.range.start.line}:${lens.command?.title}`);
    assert.deepStrictEqual(titles, ['1:$(check) Accept', '1:$(close) Reject']);
    await screenshot('vscode-preview-diff');
    const accept = lenses[0].command;
    assert.ok(accept);
    await vscode.commands.executeCommand(accept.command, ...(accept.arguments ?? []));
    assert.strictEqual(editor.document.getText(), EMOJI.after);
    await until(() => diffTab() === undefined, 10_000, 'the diff closed with the preview');
  });

  test('a preview rejected leaves the document as it was', async () => {
    const editor = await openFile(XY.before);
    assert.strictEqual((await rewriteFile(XY.instruction, 'preview')).status, 'complete');
    assert.strictEqual((await lensTitles(editor)).length, 2);
    await vscode.commands.executeCommand('specedit.rejectRewrite');
    assert.strictEqual(editor.document.getText(), XY.before);
    assert.deepStrictEqual(await lensTitles(editor), []);
  });

  test('a missing Python is reported with the command that fixes it', async () => {
    const missing = path.join(vscode.workspace.workspaceFolders?.[0].uri.fsPath ?? '/', 'no-such-python');
    await assert.rejects(
      checkServerCommand({ command: missing, args: ['-m', 'specedit.lsp'], display: missing, python: missing }),
      (error: unknown) => error instanceof ServerSetupError && /Python was not found/.test(error.message) && /pip install specedit/.test(error.fix),
    );
    await assert.rejects(
      checkServerCommand({ command: 'specedit-no-such-program', args: ['lsp'], display: 'specedit-no-such-program lsp' }),
      (error: unknown) => error instanceof ServerSetupError && /pip install specedit/.test(error.fix),
    );
  });

  test('the protocol names are the ones the server declares', () => {
    assert.deepStrictEqual(NAMES.commands, ['specedit.rewrite', 'specedit.accept', 'specedit.reject', 'specedit.cancel']);
  });

  // Last: it restarts the server on another model.
  test('Cancel stops a running rewrite and leaves the document as it was', async function () {
    const endless = process.env.SPECEDIT_VSCODE_ENDLESS_MODEL;
    if (!endless) this.skip();
    this.timeout(LOAD_TIMEOUT_MS + REWRITE_TIMEOUT_MS);
    const config = vscode.workspace.getConfiguration('specedit');
    const command = config.get<string[]>('server.command', []);
    const modelAt = command.indexOf('--model') + 1;
    assert.ok(modelAt > 0, 'specedit.server.command names a --model');
    const restarted = new Promise<void>((resolve) => {
      const listener = api.server.onDidChangeState((state) => state === 'running' && (listener.dispose(), resolve()));
    });
    await config.update('server.command', command.map((part, i) => (i === modelAt ? endless : part)), vscode.ConfigurationTarget.Global);
    await within(restarted, REWRITE_TIMEOUT_MS, 'the server restarted on the endless model');

    // The budget a file this short gets would end the endless answer before the screenshot is taken.
    await config.update('maxNewTokens', 100_000, vscode.ConfigurationTarget.Global);
    const editor = await openFile(ADD.before.repeat(3));
    // Running once the text it writes shows (its model writes nonsense, never in step with the file).
    const running = new Promise<void>((resolve) => {
      const listener = api.onDidChangeRewrite((event) => {
        if (event.kind === 'provisional' && (event.provisional?.length ?? 0) > 40) (listener.dispose(), resolve());
      });
    });
    const told = new Promise<(string | undefined)[]>((resolve) => {
      const listener = api.onDidChangeRewrite((event) => event.kind === 'ended' && (listener.dispose(), resolve([event.told])));
    });
    const rewrite = vscode.commands.executeCommand<RewriteResult>('specedit.rewriteFile', { instruction: ADD.instruction, delivery: 'live' });
    await within(running, LOAD_TIMEOUT_MS, 'the endless rewrite is writing'); // its model loads first
    await screenshot('vscode-streaming');
    await vscode.commands.executeCommand('specedit.cancelRewrite');
    const result = await within(rewrite, 10_000, 'the cancelled rewrite ended');
    await config.update('maxNewTokens', undefined, vscode.ConfigurationTarget.Global);
    assert.strictEqual(result?.status, 'cancelled', result?.message);
    assert.ok((result.stepsAfterCancel ?? 0) <= 1, `the engine stopped within a step (${result.stepsAfterCancel})`);
    assert.strictEqual(editor.document.getText(), ADD.before.repeat(3));
    assert.deepStrictEqual(await told, ['specedit: cancelled; the document is as it was.'], 'said in one line');
  });

  // After the cancel test: it breaks the server command.
  test('a server command whose Python is missing fails with the fix, and a rewrite says so', async () => {
    const missing = path.join(vscode.workspace.workspaceFolders?.[0].uri.fsPath ?? '/', 'no-such-python');
    const failed = new Promise<void>((resolve) => {
      const listener = api.server.onDidChangeState((state) => state === 'failed' && (listener.dispose(), resolve()));
    });
    const config = vscode.workspace.getConfiguration('specedit');
    await config.update('server.command', [missing, '-m', 'specedit.lsp'], vscode.ConfigurationTarget.Global);
    await within(failed, 20_000, 'the server failed to start');
    assert.match(api.server.detail, /Python was not found/);
    await openFile(XY.before);
    const result = await within(
      vscode.commands.executeCommand('specedit.rewriteFile', { instruction: XY.instruction }),
      20_000,
      'the rewrite gave up',
    );
    assert.strictEqual(result, undefined);
    assert.strictEqual(api.server.state, 'failed');
  });
});
