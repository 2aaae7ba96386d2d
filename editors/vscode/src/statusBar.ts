/**
 * The status bar item: the server and model state, and a running rewrite's speed. The model loads when
 * the server starts (`specedit.loadOnStart`): the item says "loading the model" from then until the server
 * says it is loaded (`specedit/engine`, or a rewrite's progress past the load), never "ready" before.
 */
import * as vscode from 'vscode';
import { settings } from './config';
import { EngineParams, LiveStats } from './protocol';
import { Server, ServerState } from './server';

/** Whether the model is known to be loaded: `unknown` where nothing loads it until the first rewrite. */
export type ModelState = 'unknown' | 'loading' | 'ready' | 'failed';

export class StatusBar implements vscode.Disposable {
  private readonly item = vscode.window.createStatusBarItem('specedit.status', vscode.StatusBarAlignment.Right, 100);
  private readonly changes = new vscode.EventEmitter<string>();
  /** The item's text, each time it changes (for the extension's API and its tests). */
  readonly onDidChange = this.changes.event;
  private running = 0;
  private stats: LiveStats | undefined;
  private model: ModelState = 'unknown';
  private modelMessage = LOADING; // what the server said of the model: the load, the fetch, or the error
  private said: vscode.Disposable | undefined;

  constructor(private readonly server: Server) {
    this.item.name = 'specedit';
    server.onDidChangeState((state) => {
      // A server that starts loads its model now, unless the setting leaves it to the first rewrite.
      if (state === 'starting') this.setModel(settings().get<boolean>('loadOnStart', true) ? 'loading' : 'unknown');
      this.render();
    });
    server.onDidChangeEngine((engine) => this.engine(engine));
    this.render();
    this.item.show();
  }

  get text(): string {
    return this.item.text;
  }

  /** What the server says of its engine (`specedit/engine`). */
  engine(params: EngineParams): void {
    this.setModel(params.state, params.message);
    this.render();
  }

  /** One line, for a while, where the status bar shows messages. */
  say(message: string): void {
    this.said?.dispose();
    this.said = vscode.window.setStatusBarMessage(message, SAY_MS);
  }

  rewriteStarted(): void {
    this.running += 1;
    this.stats = undefined;
    this.render();
  }

  rewriteReport(stats: LiveStats): void {
    this.stats = stats;
    // A rewrite past the model's load (queued, prefilling, writing) says it is loaded.
    if (stats.phase === 'loading' && this.model !== 'loading') this.setModel('loading');
    else if (stats.phase !== undefined && stats.phase !== 'starting' && stats.phase !== 'loading') this.setModel('ready');
    this.render();
  }

  rewriteEnded(completed = false): void {
    this.running = Math.max(0, this.running - 1);
    if (completed) this.setModel('ready');
    this.render();
  }

  dispose(): void {
    this.item.dispose();
    this.changes.dispose();
    this.said?.dispose();
  }

  private setModel(state: ModelState, message?: string): void {
    this.model = state;
    // A rewrite's report may still say "loading" once the server said "ready": it reads "loading the model".
    if (state === 'failed') this.modelMessage = message || 'the model did not load';
    else this.modelMessage = state === 'loading' && message ? message : LOADING;
  }

  private render(): void {
    const before = this.item.text;
    this.draw();
    if (this.item.text !== before) this.changes.fire(this.item.text);
  }

  private draw(): void {
    const state: ServerState = this.server.state;
    const engine = settings().get<string>('engine') || 'shared daemon';
    const model = settings().get<string>('model') || 'default model';
    this.item.backgroundColor = undefined;
    this.item.command = 'specedit.showOutput';
    if (state === 'failed') {
      this.item.text = '$(error) specedit';
      this.item.tooltip = `${this.server.detail}\nClick to restart the language server.`;
      this.item.backgroundColor = new vscode.ThemeColor('statusBarItem.errorBackground');
      this.item.command = 'specedit.restartServer';
    } else if (state === 'starting') {
      this.item.text = this.model === 'loading' ? `$(loading~spin) specedit: ${this.modelMessage}` : '$(loading~spin) specedit';
      this.item.tooltip = `specedit: starting the language server${this.model === 'loading' ? `, which loads ${model}` : ''}`;
    } else if (this.running > 0) {
      const writing = this.stats?.phase === undefined || this.stats.phase === 'writing';
      const speed = this.stats && writing ? ` ${speedText(this.stats.tokens_per_second)} tok/s` : '';
      const phase = this.stats && !writing ? `: ${this.stats.phase === 'loading' ? this.modelMessage : this.stats.phase}` : '';
      this.item.text = `$(loading~spin) specedit${speed}${phase}`;
      this.item.tooltip = this.stats ? `specedit: ${statsMessage(this.stats)}` : `specedit: starting a rewrite (${model})`;
    } else if (state === 'running' && this.model === 'loading') {
      this.item.text = `$(loading~spin) specedit: ${this.modelMessage}`;
      this.item.tooltip = `specedit: loading ${model} (engine: ${engine}); a rewrite asked for now starts once it is loaded`;
    } else if (state === 'running' && this.model === 'failed') {
      this.item.text = '$(warning) specedit: the model did not load';
      this.item.tooltip = `specedit: ${this.modelMessage}\nClick to see the server's output.`;
      this.item.backgroundColor = new vscode.ThemeColor('statusBarItem.warningBackground');
    } else if (state === 'running') {
      this.item.text = '$(sparkle) specedit';
      const when = this.model === 'ready' ? 'ready' : 'the model loads with the first rewrite';
      this.item.tooltip = `specedit: ${when} (engine: ${engine}, model: ${model})`;
    } else {
      this.item.text = '$(circle-slash) specedit';
      this.item.tooltip = 'specedit: the language server is not running; it starts with the first rewrite.';
    }
  }
}

const LOADING = 'loading the model';
const SAY_MS = 10_000; // how long a message stays in the status bar

/** The server's message (the model loading, the queue, then lines written), or one made from the figures. */
export function statsMessage(stats: LiveStats): string {
  return (
    stats.message ??
    `${stats.lines_done}/${stats.lines_total} lines · ${speedText(stats.tokens_per_second)} tok/s · ` +
      `${Math.round(100 * stats.acceptance_rate)}% accepted`
  );
}

/** Tokens per second: one decimal below 10 (a slow CPU is not "0 tok/s"). */
export function speedText(rate: number): string {
  return rate < 10 ? rate.toFixed(1) : Math.round(rate).toString();
}
