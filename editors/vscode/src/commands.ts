/**
 * The extension's commands. Each takes optional arguments, so that keybindings and other extensions can
 * skip the input box: `specedit.rewriteSelection` with `{ "instruction": "...", "delivery": "preview" }`.
 * The "(Preview)" rewrites are the same with `delivery` preview, whatever the setting says.
 */
import * as vscode from 'vscode';
import * as config from './config';
import { ACCEPT_HUNK, REJECT_HUNK } from './preview';
import { documentUri, PreviewDiffs, SHOW_DIFF } from './previewDiff';
import { KEEP_HUNK, SHOW_REMOVED, UNDO_HUNK } from './written';
import { WrittenDiffs } from './writtenDiff';
import { RewriteArgs, Rewrites } from './rewrite';
import { Server } from './server';

export function registerCommands(rewrites: Rewrites, server: Server, diffs: PreviewDiffs, writtenDiffs: WrittenDiffs): vscode.Disposable[] {
  const rewrite = (whole: boolean, delivery?: 'preview') => async (args?: RewriteArgs) => {
    const editor = vscode.window.activeTextEditor;
    if (!editor) return undefined;
    const asked = delivery ? { ...args, delivery } : args;
    const request = asked?.instruction !== undefined || asked?.sketch !== undefined ? asked : await askInstruction(editor, asked);
    if (!request) return undefined;
    return run(rewrites, editor, whole ? undefined : selectedLines(editor), request);
  };
  // The document, also when the active editor is the right side of its preview's diff.
  const activeUri = (): vscode.Uri | undefined => {
    const uri = vscode.window.activeTextEditor?.document.uri;
    return uri && documentUri(uri);
  };
  const actAtCursor = (accept: boolean) => {
    const editor = vscode.window.activeTextEditor;
    if (!editor) return undefined;
    const inDiff = diffs.hunkAt(editor); // on the right side of a preview's diff
    if (inDiff) return accept ? rewrites.accept(inDiff.uri, [inDiff.id]) : rewrites.reject(inDiff.uri, [inDiff.id]);
    return rewrites.actOnHunkAtCursor(editor, accept);
  };
  return [
    vscode.commands.registerCommand('specedit.rewriteSelection', rewrite(false)),
    vscode.commands.registerCommand('specedit.rewriteFile', rewrite(true)),
    vscode.commands.registerCommand('specedit.rewriteSelectionPreview', rewrite(false, 'preview')),
    vscode.commands.registerCommand('specedit.rewriteFilePreview', rewrite(true, 'preview')),
    vscode.commands.registerCommand('specedit.applySketch', (args?: RewriteArgs) => applySketch(rewrites, args)),
    vscode.commands.registerCommand('specedit.acceptRewrite', (uri?: vscode.Uri) => {
      const target = uri ?? activeUri();
      return target && rewrites.accept(target);
    }),
    vscode.commands.registerCommand('specedit.rejectRewrite', (uri?: vscode.Uri) => {
      const target = uri ?? activeUri();
      return target && rewrites.reject(target);
    }),
    vscode.commands.registerCommand('specedit.cancelRewrite', (uri?: vscode.Uri) =>
      rewrites.cancelAll(uri ?? (rewrites.isRunning(activeUri()) ? activeUri() : undefined)),
    ),
    vscode.commands.registerCommand(ACCEPT_HUNK, (uri: string, _jobId: string, hunkId: number) =>
      rewrites.accept(vscode.Uri.parse(uri), [hunkId]),
    ),
    vscode.commands.registerCommand(REJECT_HUNK, (uri: string, _jobId: string, hunkId: number) =>
      rewrites.reject(vscode.Uri.parse(uri), [hunkId]),
    ),
    vscode.commands.registerCommand(KEEP_HUNK, (uri: string, _jobId: string, hunkId: number) =>
      rewrites.keep(vscode.Uri.parse(uri), [hunkId]),
    ),
    vscode.commands.registerCommand(UNDO_HUNK, (uri: string, _jobId: string, hunkId: number) =>
      rewrites.reject(vscode.Uri.parse(uri), [hunkId]),
    ),
    vscode.commands.registerCommand(SHOW_REMOVED, (uri?: string) => {
      const target = uri !== undefined ? vscode.Uri.parse(uri) : activeUri();
      return target && writtenDiffs.open(target);
    }),
    vscode.commands.registerCommand('specedit.acceptHunkAtCursor', () => actAtCursor(true)),
    vscode.commands.registerCommand('specedit.rejectHunkAtCursor', () => actAtCursor(false)),
    vscode.commands.registerCommand(SHOW_DIFF, (uri?: vscode.Uri) => {
      const target = uri ?? activeUri();
      return target && diffs.open(target);
    }),
    vscode.commands.registerCommand('specedit.nextHunk', () => {
      const editor = vscode.window.activeTextEditor;
      return editor && rewrites.jump(editor, 1);
    }),
    vscode.commands.registerCommand('specedit.previousHunk', () => {
      const editor = vscode.window.activeTextEditor;
      return editor && rewrites.jump(editor, -1);
    }),
    vscode.commands.registerCommand('specedit.restartServer', () => server.restart().catch(() => undefined)),
    vscode.commands.registerCommand('specedit.showOutput', () => server.output.show()),
  ];
}

/**
 * Merge an edit sketch (what a chat answered: the changed parts, `... existing code ...` for the rest) from
 * the clipboard, or `args.sketch`, into the selected lines or the whole file; a preview unless
 * `args.delivery` says otherwise. The server refuses an answer that is not a merge (nothing is applied).
 */
async function applySketch(rewrites: Rewrites, args?: RewriteArgs) {
  const editor = vscode.window.activeTextEditor;
  if (!editor) return undefined;
  const sketch = args?.sketch ?? (await vscode.env.clipboard.readText());
  if (!sketch.trim()) {
    void vscode.window.showWarningMessage('specedit: the clipboard holds no edit sketch (copy the chat\'s answer first)');
    return undefined;
  }
  const range = editor.selection.isEmpty ? undefined : selectedLines(editor);
  return run(rewrites, editor, range, { sketch, delivery: args?.delivery ?? 'preview' });
}

/** A rewrite of `range` (undefined: the whole file); an error is shown, not thrown (setup errors show their own). */
async function run(rewrites: Rewrites, editor: vscode.TextEditor, range: vscode.Range | undefined, request: RewriteArgs) {
  try {
    return await rewrites.rewrite(editor, range, request);
  } catch (error) {
    if (!(error instanceof config.ServerSetupError)) {
      void vscode.window.showErrorMessage(`specedit: ${error instanceof Error ? error.message : String(error)}`);
    }
    return undefined;
  }
}

/** The selection as whole lines (a selection ending at column 0 leaves that line out); empty: the cursor's line. */
export function selectedLines(editor: vscode.TextEditor): vscode.Range {
  const { start, end } = editor.selection;
  const document = editor.document;
  const last = end.line > start.line && end.character === 0 ? end.line - 1 : end.line;
  const stop = last + 1 < document.lineCount ? new vscode.Position(last + 1, 0) : document.lineAt(last).range.end;
  return new vscode.Range(start.line, 0, stop.line, stop.character);
}

/** The instruction box: type an instruction, or pick a preset. */
async function askInstruction(editor: vscode.TextEditor, args?: RewriteArgs): Promise<RewriteArgs | undefined> {
  const presets = config.presets(editor.document);
  const pick = vscode.window.createQuickPick();
  pick.title = 'specedit: rewrite';
  pick.placeholder = 'How should the code change? (an instruction, or pick a preset)';
  const presetItems = presets.map((preset) => ({ label: preset.title, detail: preset.instruction }));
  pick.items = presetItems;
  pick.onDidChangeValue((value) => {
    pick.items = value.trim() ? [{ label: value, description: 'rewrite with this instruction', alwaysShow: true }, ...presetItems] : presetItems;
  });
  const instruction = await new Promise<string | undefined>((resolve) => {
    pick.onDidAccept(() => resolve(pick.selectedItems[0]?.detail ?? pick.selectedItems[0]?.label ?? (pick.value || undefined)));
    pick.onDidHide(() => resolve(undefined));
    pick.show();
  });
  pick.dispose();
  return instruction?.trim() ? { ...args, instruction: instruction.trim() } : undefined;
}
