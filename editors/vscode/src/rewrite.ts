/**
 * Rewrites: `specedit/rewrite` sent for a document, its progress and partial results followed, and the
 * Accept / Reject / Cancel that act on it. The server does the work; this file forwards and reports.
 *
 * - live: the server writes hunks as they settle (see editApplier.ts: one undo step per rewrite), and
 *   the text not settled yet before them, which provisional.ts marks as pending. Each report says where
 *   the written hunks are: written.ts marks them as a diff (writtenDiff.ts too), and follow.ts keeps the
 *   writing in view.
 * - preview: partial results carry the hunks; preview.ts shows them until accepted or rejected.
 * - A live rewrite the server turns into a preview (an answer that removes most of the code, or Cancel)
 *   ends with the document as it was and its hunks `offered`: shown as a preview, and said in one line.
 * - Reject after a finished live rewrite restores the original too.
 */
import { randomUUID } from 'crypto';
import * as vscode from 'vscode';
import {
  ExecuteCommandRequest,
  LanguageClient,
  LSPErrorCodes,
  ProgressType,
  ResponseError,
} from 'vscode-languageclient/node';
import * as config from './config';
import { EditApplier } from './editApplier';
import { coveredLines, Previews } from './preview';
import { FollowWriting } from './follow';
import { ProvisionalMarks } from './provisional';
import { ShownHunk, WrittenHunks } from './written';
import {
  COMMAND_ACCEPT,
  COMMAND_REJECT,
  Delivery,
  EditResult,
  JobSelector,
  LiveStats,
  REWRITE_METHOD,
  RewritePartialResult,
  RewriteParams,
  RewriteResult,
} from './protocol';
import { Server } from './server';
import { statsMessage, StatusBar } from './statusBar';

export interface RewriteArgs {
  instruction?: string;
  sketch?: string;
  delivery?: Delivery;
}

/** What the extension's API tells listeners (and its tests) about rewrites. */
export interface RewriteEvent {
  uri: vscode.Uri;
  kind: 'started' | 'report' | 'provisional' | 'ended';
  delivery: Delivery;
  jobId?: string;
  stats?: LiveStats;
  result?: RewriteResult;
  told?: string; // what the user was told when it ended (a notification or the status bar), if anything
  provisional?: string; // the text marked as still being written (kind 'provisional'; undefined: none)
  written?: ShownHunk[]; // kind 'report' of a live rewrite: its written hunks as shown now
}

interface Running {
  uri: vscode.Uri;
  delivery: Delivery;
  cancellation: vscode.CancellationTokenSource;
  jobId?: string;
  cancelled: boolean;
  editsBefore: number; // edits applied to the document before the rewrite started
  becamePreview: boolean; // a live rewrite the server stopped writing: it ends as a preview
}

const partialResult = new ProgressType<RewritePartialResult>();
const STALE_RETRIES = 3; // the document changed between reading its version and the server seeing it

export class Rewrites implements vscode.Disposable {
  private readonly running = new Set<Running>();
  private readonly lastLiveJob = new Map<string, string>(); // uri -> its last live job, for Reject
  private readonly events = new vscode.EventEmitter<RewriteEvent>();
  readonly onDidChange = this.events.event;
  readonly follow = new FollowWriting();

  constructor(
    private readonly server: Server,
    private readonly applier: EditApplier,
    private readonly previews: Previews,
    private readonly provisional: ProvisionalMarks,
    private readonly written: WrittenHunks,
    private readonly status: StatusBar,
  ) {
    provisional.onDidChange((change) => {
      const run = [...this.running].find((candidate) => candidate.uri.toString() === change.uri.toString());
      if (!run) return;
      if (change.range && run.delivery === 'live') this.follow.to(run.uri, lastLineOf(change.range));
      this.events.fire({ uri: run.uri, kind: 'provisional', delivery: run.delivery, jobId: run.jobId, provisional: change.text });
    });
  }

  /** Rewrites `range` (whole lines; undefined: the file). Resolves when the rewrite has ended. */
  async rewrite(editor: vscode.TextEditor, range: vscode.Range | undefined, args: RewriteArgs): Promise<RewriteResult | undefined> {
    const client = await this.server.ready();
    const document = editor.document;
    const run: Running = {
      uri: document.uri,
      delivery: args.delivery ?? config.delivery(document),
      cancellation: new vscode.CancellationTokenSource(),
      cancelled: false,
      editsBefore: this.applier.appliedCount(document.uri),
      becamePreview: false,
    };
    const token = `specedit-${randomUUID()}`;
    const title = `specedit: ${args.instruction ?? 'merging the edit sketch'}`.slice(0, 80);
    return vscode.window.withProgress(
      { location: vscode.ProgressLocation.Notification, title, cancellable: true },
      async (progress, cancel) => {
        cancel.onCancellationRequested(() => void this.cancel(run));
        let percent = 0;
        const listener = client.onProgress(partialResult, token, (partial) => {
          run.jobId = partial.jobId;
          if (run.delivery === 'preview' && partial.hunks.length > 0) this.previews.add(run.uri, partial.jobId, partial.hunks);
          if (run.delivery === 'live') this.showWritten(client, run, partial);
          const done = (100 * partial.stats.lines_done) / Math.max(partial.stats.lines_total, 1);
          progress.report({ message: statsMessage(partial.stats), increment: Math.max(0, done - percent) });
          percent = Math.max(percent, done);
          this.status.rewriteReport(partial.stats);
          const written = run.delivery === 'live' ? this.written.shown(run.uri) : undefined;
          this.events.fire({ uri: run.uri, kind: 'report', delivery: run.delivery, jobId: run.jobId, stats: partial.stats, written });
        });
        this.begin(run, editor, range);
        let result: RewriteResult | undefined;
        let told: string | undefined;
        try {
          result = await this.send(client, document, range, args, run, token);
          told = await this.conclude(client, run, result);
          return result;
        } finally {
          listener.dispose();
          this.end(run, result, told);
        }
      },
    );
  }

  /** Stops running rewrites (of `uri`, or all) and restores what they wrote. */
  async cancelAll(uri?: vscode.Uri): Promise<number> {
    const runs = [...this.running].filter((run) => uri === undefined || run.uri.toString() === uri.toString());
    await Promise.all(runs.map((run) => this.cancel(run)));
    return runs.length;
  }

  isRunning(uri?: vscode.Uri): boolean {
    return [...this.running].some((run) => uri === undefined || run.uri.toString() === uri.toString());
  }

  /** Writes the previewed hunks (all, or `hunkIds`); with no preview, keeps what the last live rewrite
   * wrote. */
  async accept(uri: vscode.Uri, hunkIds?: number[]): Promise<EditResult | undefined> {
    const session = this.previews.get(uri);
    if (!session) {
      const written = this.written.get(uri);
      if (!written || this.isRunning(uri)) return undefined;
      const kept = hunkIds ?? [...written.hunks.keys()];
      this.keep(uri, kept);
      return { jobId: written.jobId, applied: kept, skipped: [] };
    }
    const result = await this.command(COMMAND_ACCEPT, { jobId: session.jobId, hunks: hunkIds ?? [...session.hunks.keys()] });
    this.previews.remove(uri, [...result.applied, ...result.skipped]);
    if (result.skipped.length > 0) {
      void vscode.window.showWarningMessage(`specedit: ${result.skipped.length} change(s) left out: you had edited there.`);
    }
    return result;
  }

  /** Drops the previewed hunks (all, or `hunkIds`); with no preview, undoes the last live rewrite (all
   * of it, or its hunks `hunkIds`). */
  async reject(uri: vscode.Uri, hunkIds?: number[]): Promise<EditResult | undefined> {
    if (this.isRunning(uri)) {
      await this.cancelAll(uri);
      return undefined;
    }
    const session = this.previews.get(uri);
    const jobId = session?.jobId ?? this.lastLiveJob.get(uri.toString());
    if (jobId === undefined) return undefined;
    const selector: JobSelector = { jobId };
    if (session) selector.hunks = hunkIds ?? [...session.hunks.keys()];
    else if (hunkIds) selector.hunks = hunkIds;
    const result = await this.command(COMMAND_REJECT, selector);
    if (session) this.previews.remove(uri, selector.hunks ?? []);
    else if (hunkIds) this.written.remove(uri, hunkIds);
    else {
      this.lastLiveJob.delete(uri.toString());
      this.written.clear(uri);
    }
    return result;
  }

  /** Keeps hunks a rewrite wrote: they are no longer offered for undo. */
  keep(uri: vscode.Uri, hunkIds: number[]): void {
    this.written.remove(uri, hunkIds);
  }

  /** The hunk under the cursor, previewed or written: accepted (written, or kept) or rejected (dropped, or
   * undone). */
  async actOnHunkAtCursor(editor: vscode.TextEditor, accept: boolean): Promise<EditResult | undefined> {
    const uri = editor.document.uri;
    const line = editor.selection.active.line;
    const within = (range: vscode.Range) => {
      const lines = coveredLines(range);
      return lines.start.line <= line && line <= lines.end.line;
    };
    const previewed = [...(this.previews.get(uri)?.hunks.values() ?? [])].find((hunk) => within(hunk.range));
    if (previewed) return accept ? this.accept(uri, [previewed.id]) : this.reject(uri, [previewed.id]);
    const written = [...(this.written.get(uri)?.hunks ?? [])].find(([, hunk]) => within(hunk.range));
    if (!written) return undefined;
    if (!accept) return this.reject(uri, [written[0]]);
    this.keep(uri, [written[0]]);
    return undefined;
  }

  /** Moves the cursor to the next (1) or previous (-1) hunk shown, previewed or written. */
  jump(editor: vscode.TextEditor, direction: 1 | -1): boolean {
    const uri = editor.document.uri;
    const starts = [
      ...[...(this.previews.get(uri)?.hunks.values() ?? [])].map((hunk) => hunk.range.start.line),
      ...[...(this.written.get(uri)?.hunks.values() ?? [])].map((hunk) => hunk.range.start.line),
    ].sort((a, b) => a - b);
    const line = editor.selection.active.line;
    const target = direction > 0 ? starts.find((start) => start > line) : starts.reverse().find((start) => start < line);
    if (target === undefined) return false;
    const position = new vscode.Position(target, 0);
    editor.selection = new vscode.Selection(position, position);
    editor.revealRange(new vscode.Range(position, position));
    return true;
  }

  dispose(): void {
    void this.cancelAll();
    this.events.dispose();
  }

  private async send(
    client: LanguageClient,
    document: vscode.TextDocument,
    range: vscode.Range | undefined,
    args: RewriteArgs,
    run: Running,
    partialResultToken: string,
  ): Promise<RewriteResult | undefined> {
    await this.server.synced(document.uri);
    for (let attempt = 0; ; attempt++) {
      const params: RewriteParams = {
        textDocument: { uri: client.code2ProtocolConverter.asUri(document.uri), version: document.version },
        range: range && client.code2ProtocolConverter.asRange(range),
        instruction: args.instruction,
        sketch: args.sketch,
        delivery: run.delivery,
        maxNewTokens: config.maxNewTokens(document),
        partialResultToken,
      };
      try {
        return await client.sendRequest<RewriteResult>(REWRITE_METHOD, params, run.cancellation.token);
      } catch (error) {
        if (run.cancelled) return undefined;
        if (error instanceof ResponseError && error.code === LSPErrorCodes.ContentModified && attempt < STALE_RETRIES) continue;
        throw error;
      }
    }
  }

  /** Restores what a cancelled live rewrite wrote (where the server has not); tells the user how a
   * rewrite ended, when it matters (what it told, returned). */
  private async conclude(client: LanguageClient, run: Running, result: RewriteResult | undefined): Promise<string | undefined> {
    run.jobId = result?.jobId ?? run.jobId;
    run.becamePreview ||= run.delivery === 'live' && result?.delivery === 'preview';
    if (run.delivery === 'live' && run.jobId !== undefined && !run.becamePreview) this.lastLiveJob.set(run.uri.toString(), run.jobId);
    const wrote = this.applier.appliedCount(run.uri) > run.editsBefore;
    if (run.cancelled && run.delivery === 'live' && run.jobId !== undefined && wrote && !run.becamePreview) {
      // A server that does not offer a cancelled rewrite as a preview: the document is restored here.
      await this.command(COMMAND_REJECT, { jobId: run.jobId }, client);
      this.lastLiveJob.delete(run.uri.toString());
      this.written.clear(run.uri);
    }
    if (result === undefined) {
      if (run.delivery === 'preview' && run.jobId !== undefined) this.previews.clear(run.uri, run.jobId);
      return run.cancelled ? this.cancelled(run) : undefined;
    }
    if (run.becamePreview) return this.offer(run, result);
    if (result.status === 'cancelled') {
      if (run.delivery === 'preview') this.previews.clear(run.uri, result.jobId);
      return this.cancelled(run);
    }
    if (run.delivery === 'preview' && result.status !== 'complete') this.previews.clear(run.uri, result.jobId);
    if (run.delivery !== 'preview') {
      if (result.status === 'complete' && result.written) this.written.show(client, run.uri, result.jobId, result.written);
      this.written.finished(run.uri, result.jobId);
    }
    const changed = run.delivery === 'preview' ? this.previews.has(run.uri) : wrote;
    if (result.status === 'complete' && !changed) {
      const told = 'specedit: no changes.';
      void vscode.window.showInformationMessage(told);
      return told;
    } else if (result.status === 'complete' && run.delivery === 'live') {
      const count = this.written.get(run.uri)?.hunks.size ?? 0;
      const told = count > 0 ? `specedit: done: ${plural(count, 'change')} written; Keep or Undo each.` : 'specedit: done.';
      this.status.say(told);
      return told;
    } else if (result.status === 'conflict') {
      const told = `specedit: stopped: ${result.message ?? 'the document was edited where the rewrite had not written yet'}.`;
      void vscode.window.showWarningMessage(told);
      return told;
    } else if (result.status === 'error') {
      const told = `specedit: ${result.message ?? 'the rewrite failed'}`;
      void vscode.window.showErrorMessage(told, 'Show Output').then((choice) => {
        if (choice) this.server.output.show();
      });
      return told;
    }
    return undefined;
  }

  /** A live rewrite the server stopped writing (an answer that removes most of the code, or Cancel): the
   * document is as it was, and its hunks, where their old text is now, are shown as a preview. */
  private offer(run: Running, result: RewriteResult): string {
    this.written.clear(run.uri);
    this.lastLiveJob.delete(run.uri.toString());
    const offered = result.offered;
    const document = vscode.workspace.textDocuments.find((doc) => doc.uri.toString() === run.uri.toString());
    const shown = offered !== undefined && offered.hunks.length > 0 && document?.version === offered.version;
    if (!shown && result.status === 'cancelled') return this.cancelled(run);
    if (!shown) {
      const told = `specedit: ${result.message ?? 'shown as a preview'}; the document has changed since: nothing to offer.`;
      void vscode.window.showWarningMessage(told);
      return told;
    }
    this.previews.add(run.uri, result.jobId, offered.hunks);
    const count = offered.hunks.length;
    const told =
      result.status === 'cancelled'
        ? `specedit: cancelled; the document is as it was, and its ${plural(count, 'change')} ${count === 1 ? 'is' : 'are'} a preview: Accept or Reject.`
        : `specedit: ${result.message ?? 'shown as a preview'}. Accept or Reject.`;
    const show = result.status === 'cancelled' ? vscode.window.showInformationMessage : vscode.window.showWarningMessage;
    void show(told, 'Accept', 'Reject').then((choice) => {
      if (choice === 'Accept') void this.accept(run.uri);
      if (choice === 'Reject') void this.reject(run.uri);
    });
    return told;
  }

  /** A rewrite the user cancelled, with nothing to offer: said in the status bar. */
  private cancelled(run: Running): string {
    const told = run.delivery === 'live' ? 'specedit: cancelled; the document is as it was.' : 'specedit: cancelled.';
    this.status.say(told);
    return told;
  }

  /** A live rewrite's report: its written hunks marked where they are now, and the view on the last. */
  private showWritten(client: LanguageClient, run: Running, partial: RewritePartialResult): void {
    if (partial.delivery === 'preview' && !run.becamePreview) {
      run.becamePreview = true; // the server has taken out what it wrote: nothing to mark or follow
      this.written.clear(run.uri);
      this.follow.stop(run.uri);
    }
    if (run.becamePreview || !partial.written) return;
    if (!this.written.show(client, run.uri, partial.jobId, partial.written, true)) return;
    const last = this.written.shown(run.uri).at(-1);
    if (last) this.follow.to(run.uri, last.line + Math.max(last.added - 1, 0));
  }

  private async cancel(run: Running): Promise<void> {
    if (run.cancelled) return;
    run.cancelled = true;
    run.cancellation.cancel(); // $/cancelRequest: the server ends the job within one engine step
  }

  private begin(run: Running, editor: vscode.TextEditor, range: vscode.Range | undefined): void {
    this.running.add(run);
    this.written.clear(run.uri); // what the last rewrite wrote is no longer offered for undo hunk by hunk
    if (!editor.selection.isEmpty) {
      // No selection highlight over the lines being rewritten: a cursor where the rewrite starts.
      const at = range?.start ?? editor.selection.active;
      editor.selection = new vscode.Selection(at, at);
    }
    if (run.delivery === 'live') {
      this.applier.open(run.uri);
      this.follow.start(run.uri);
    }
    this.status.rewriteStarted();
    void vscode.commands.executeCommand('setContext', 'specedit.rewriting', true);
    this.events.fire({ uri: run.uri, kind: 'started', delivery: run.delivery });
  }

  private end(run: Running, result: RewriteResult | undefined, told?: string): void {
    this.running.delete(run);
    if (run.delivery === 'live') {
      this.applier.close(run.uri);
      this.follow.stop(run.uri);
    }
    this.provisional.clear(run.uri); // the server has taken it out (or has stopped)
    this.status.rewriteEnded(result?.status === 'complete');
    void vscode.commands.executeCommand('setContext', 'specedit.rewriting', this.running.size > 0);
    this.events.fire({ uri: run.uri, kind: 'ended', delivery: run.delivery, jobId: run.jobId, result, told });
  }

  private async command(command: string, selector: JobSelector, client?: LanguageClient): Promise<EditResult> {
    const ready = client ?? (await this.server.ready());
    return ready.sendRequest(ExecuteCommandRequest.type, { command, arguments: [selector] }) as Promise<EditResult>;
  }
}

/** The last line a range covers (a range ending at column 0 stops on the line before). */
function lastLineOf(range: vscode.Range): number {
  return range.end.character === 0 && range.end.line > range.start.line ? range.end.line - 1 : range.end.line;
}

function plural(count: number, noun: string): string {
  return `${count} ${noun}${count === 1 ? '' : 's'}`;
}
