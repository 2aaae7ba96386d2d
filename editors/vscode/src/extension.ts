/**
 * specedit for VS Code: starts the specedit language server, forwards rewrites to it, renders them.
 *
 * The server does the work (rewrite jobs, hunks, versioned edits); this extension starts it (server.ts),
 * applies its edits as one undo step per rewrite (editApplier.ts), marks the text a live rewrite is still
 * writing (provisional.ts) and what it wrote as a diff (written.ts, writtenDiff.ts), shows previews
 * (preview.ts) and their diffs (previewDiff.ts), and offers the commands (commands.ts), the progress
 * (rewrite.ts) and the status bar item (statusBar.ts).
 */
import * as vscode from 'vscode';
import { registerCommands } from './commands';
import { needsRestart } from './config';
import { EditApplier } from './editApplier';
import { Previews } from './preview';
import { documentUri, PreviewDiffs } from './previewDiff';
import { ProvisionalMarks } from './provisional';
import { WrittenHunks } from './written';
import { WrittenDiffs } from './writtenDiff';
import { RewriteEvent, Rewrites } from './rewrite';
import { Server } from './server';
import { StatusBar } from './statusBar';

/** What `activate` returns: for other extensions, and for this extension's tests. */
export interface SpeceditApi {
  readonly onDidChangeRewrite: vscode.Event<RewriteEvent>;
  readonly server: Server;
  readonly rewrites: Rewrites;
  readonly previews: Previews;
  readonly written: WrittenHunks;
  readonly writtenDiffs: WrittenDiffs;
  readonly status: StatusBar;
}

let server: Server | undefined;

export function activate(context: vscode.ExtensionContext): SpeceditApi {
  const output = vscode.window.createOutputChannel('specedit', { log: true });
  const applier = new EditApplier();
  const provisional = new ProvisionalMarks();
  server = new Server(output, applier, provisional);
  const status = new StatusBar(server);
  const previews = new Previews();
  const diffs = new PreviewDiffs(previews);
  const written = new WrittenHunks();
  const writtenDiffs = new WrittenDiffs(written, provisional);
  const rewrites = new Rewrites(server, applier, previews, provisional, written, status);
  // A preview's diff (its right side) counts as the document it shows the proposal for.
  const shownUri = (editor = vscode.window.activeTextEditor) => editor && documentUri(editor.document.uri);
  const hunksContext = (editor = vscode.window.activeTextEditor) =>
    vscode.commands.executeCommand('setContext', 'specedit.hasHunks', previews.has(shownUri(editor)) || written.has(shownUri(editor)));
  const started = server;

  context.subscriptions.push(
    output,
    server,
    status,
    previews,
    diffs,
    provisional,
    written,
    writtenDiffs,
    rewrites,
    vscode.languages.registerCodeLensProvider({ scheme: 'file' }, previews),
    vscode.languages.registerCodeLensProvider({ scheme: 'untitled' }, previews),
    vscode.languages.registerCodeLensProvider({ scheme: 'file' }, written),
    vscode.languages.registerCodeLensProvider({ scheme: 'untitled' }, written),
    previews.onDidChangeCodeLenses(() => void hunksContext()),
    written.onDidChangeCodeLenses(() => void hunksContext()),
    ...registerCommands(rewrites, server, diffs, writtenDiffs),
    vscode.workspace.onDidChangeConfiguration((event) => {
      if (needsRestart(event) && started.state !== 'stopped') void started.restart().catch(() => undefined);
    }),
    vscode.window.onDidChangeActiveTextEditor((editor) => {
      void vscode.commands.executeCommand('setContext', 'specedit.hasPreview', previews.has(shownUri(editor)));
      void hunksContext(editor);
    }),
  );

  // Activated by a language (not by a command): start now, so that the code actions are there. A failure
  // to start has been reported; commands try again.
  if (vscode.window.visibleTextEditors.some((editor) => ['file', 'untitled'].includes(editor.document.uri.scheme))) {
    server.ready().catch(() => undefined);
  }
  return { onDidChangeRewrite: rewrites.onDidChange, server, rewrites, previews, written, writtenDiffs, status };
}

export async function deactivate(): Promise<void> {
  await server?.stop();
  server = undefined;
}
