/** The status bar item: the server and engine state, and a running rewrite's speed. */
import * as vscode from 'vscode';
import { settings } from './config';
import { LiveStats } from './protocol';
import { Server, ServerState } from './server';

export class StatusBar implements vscode.Disposable {
  private readonly item = vscode.window.createStatusBarItem('specedit.status', vscode.StatusBarAlignment.Right, 100);
  private running = 0;
  private stats: LiveStats | undefined;

  constructor(private readonly server: Server) {
    this.item.name = 'specedit';
    server.onDidChangeState(() => this.render());
    this.render();
    this.item.show();
  }

  rewriteStarted(): void {
    this.running += 1;
    this.stats = undefined;
    this.render();
  }

  rewriteReport(stats: LiveStats): void {
    this.stats = stats;
    this.render();
  }

  rewriteEnded(): void {
    this.running = Math.max(0, this.running - 1);
    this.render();
  }

  dispose(): void {
    this.item.dispose();
  }

  private render(): void {
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
      this.item.text = '$(loading~spin) specedit';
      this.item.tooltip = 'specedit: starting the language server';
    } else if (this.running > 0) {
      const writing = this.stats?.phase === undefined || this.stats.phase === 'writing';
      const speed = this.stats && writing ? ` ${speedText(this.stats.tokens_per_second)} tok/s` : '';
      const phase = this.stats && !writing ? ` ${this.stats.phase}` : '';
      this.item.text = `$(loading~spin) specedit${speed}${phase}`;
      this.item.tooltip = this.stats ? `specedit: ${statsMessage(this.stats)}` : `specedit: starting a rewrite (${model})`;
    } else if (state === 'running') {
      this.item.text = '$(sparkle) specedit';
      this.item.tooltip = `specedit: ready (engine: ${engine}, model: ${model})`;
    } else {
      this.item.text = '$(circle-slash) specedit';
      this.item.tooltip = 'specedit: the language server is not running; it starts with the first rewrite.';
    }
  }
}

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
