/**
 * The language server's life: checked, started on first need, restarted when its command changes,
 * and its state told to whoever listens (the status bar).
 */
import * as vscode from 'vscode';
import {
  ApplyWorkspaceEditRequest,
  CloseAction,
  ErrorAction,
  ErrorHandler,
  LanguageClient,
  State,
} from 'vscode-languageclient/node';
import { checkServerCommand, SECTION, serverCommand, ServerSetupError, settings } from './config';
import { EditApplier } from './editApplier';
import { EngineParams, NAMES, ProvisionalParams } from './protocol';
import { ProvisionalMarks } from './provisional';

export type ServerState = 'stopped' | 'starting' | 'running' | 'failed';

const MAX_RESTARTS = 3; // after a crash, before giving up until the user restarts it

export class Server implements vscode.Disposable {
  private client: LanguageClient | undefined;
  private starting: Promise<LanguageClient> | undefined;
  private readonly opening = new Map<string, Promise<void>>(); // uri -> its last didOpen, sent or being sent
  private readonly stateEmitter = new vscode.EventEmitter<ServerState>();
  readonly onDidChangeState = this.stateEmitter.event;
  private readonly engineEmitter = new vscode.EventEmitter<EngineParams>();
  /** What the server says of its engine (`specedit/engine`): the model loading, ready, or failed. */
  readonly onDidChangeEngine = this.engineEmitter.event;
  engine: EngineParams | undefined; // what the running server said of its engine last
  state: ServerState = 'stopped';
  detail = '';

  constructor(
    readonly output: vscode.LogOutputChannel,
    private readonly applier: EditApplier,
    private readonly provisional: ProvisionalMarks,
  ) {}

  /** The running client, started if need be. Rejects (after telling the user) when it cannot start. */
  ready(): Promise<LanguageClient> {
    const client = this.client;
    // The client runs from the server's answer to initialize on, but sends the open documents' didOpen only
    // at the end of its start: `client.start()` is that start (a restart's too), or done.
    if (!this.starting && client?.state === State.Running) return client.start().then(() => client);
    this.starting ??= this.start().finally(() => (this.starting = undefined));
    return this.starting;
  }

  /** Resolves once `uri`'s didOpen is on its way to the server (at once for a document it was not sent). A
   * request about the document sent after it reaches the server after it. */
  async synced(uri: vscode.Uri): Promise<void> {
    await this.opening.get(uri.toString());
  }

  async restart(): Promise<void> {
    await this.stop();
    await this.ready();
  }

  async stop(): Promise<void> {
    const client = this.client;
    this.client = undefined;
    if (client) await client.dispose(5000).catch(() => undefined);
    this.setState('stopped');
  }

  dispose(): void {
    void this.stop();
    this.stateEmitter.dispose();
    this.engineEmitter.dispose();
  }

  private async start(): Promise<LanguageClient> {
    await this.stop();
    this.setState('starting');
    const server = serverCommand();
    try {
      await checkServerCommand(server);
    } catch (error) {
      throw this.failed(error instanceof ServerSetupError ? error : new ServerSetupError(String(error), ''));
    }
    this.output.info(`starting the language server: ${server.display}`);
    const stderr = new Tail();
    const client = new LanguageClient(
      'specedit',
      'specedit',
      // No `transport`: with TransportKind.stdio, vscode-languageclient appends `--stdio` to the arguments.
      { command: server.command, args: server.args },
      {
        documentSelector: [{ scheme: 'file' }, { scheme: 'untitled' }],
        outputChannel: stderr.recording(this.output),
        initializationOptions: JSON.parse(JSON.stringify(settings())) as unknown,
        synchronize: { configurationSection: SECTION },
        errorHandler: this.errorHandler(),
        initializationFailedHandler: () => false,
        middleware: {
          didOpen: (document, next) => {
            const sent = next(document);
            this.opening.set(document.uri.toString(), sent.catch(() => undefined));
            return sent;
          },
          didClose: (document, next) => {
            this.opening.delete(document.uri.toString());
            return next(document);
          },
        },
      },
    );
    client.onDidChangeState((event) => {
      if (this.client !== client) return;
      if (event.newState === State.Running) this.setState('running');
      else if (event.newState === State.Stopped && this.state === 'running') this.setState('failed', 'the server stopped');
    });
    client.onRequest(ApplyWorkspaceEditRequest.type, (params) => this.applier.handle(client, params));
    client.onNotification(NAMES.provisionalNotification, (params: ProvisionalParams) => this.provisional.show(client, params));
    client.onNotification(NAMES.engineNotification, (params: EngineParams) => {
      if (this.client !== client) return;
      this.engine = params;
      this.engineEmitter.fire(params);
    });
    this.client = client;
    try {
      await client.start();
    } catch (error) {
      this.client = undefined;
      await client.dispose(1000).catch(() => undefined);
      throw this.failed(
        new ServerSetupError(
          `specedit: the language server did not start (${server.display}): ${stderr.last() || message(error)}`,
          'See Output › specedit for its error; "specedit.server.command" sets the command.',
        ),
      );
    }
    this.setState('running');
    return client;
  }

  /** Restart after a crash (a few times), not after a failed start; tell the user when giving up. */
  private errorHandler(): ErrorHandler {
    let restarts = 0;
    return {
      error: (_error, _message, count) => ({ action: (count ?? 0) <= 3 ? ErrorAction.Continue : ErrorAction.Shutdown }),
      closed: () => {
        if (this.state !== 'running') return { action: CloseAction.DoNotRestart, handled: true }; // start() reports it
        if (++restarts <= MAX_RESTARTS) {
          this.setState('starting', 'restarting after a crash');
          return { action: CloseAction.Restart, handled: true };
        }
        this.setState('failed', 'the language server stopped');
        return {
          action: CloseAction.DoNotRestart,
          message: 'specedit: the language server stopped (see Output › specedit); "specedit: Restart Language Server" starts it again.',
        };
      },
    };
  }

  private failed(error: ServerSetupError): ServerSetupError {
    this.output.error(`${error.message} ${error.fix}`);
    this.setState('failed', error.message);
    void vscode.window.showErrorMessage(`${error.message} ${error.fix}`, 'Open Settings', 'Show Output').then((choice) => {
      if (choice === 'Open Settings') void vscode.commands.executeCommand('workbench.action.openSettings', `${SECTION}.server`);
      if (choice === 'Show Output') this.output.show();
    });
    return error;
  }

  private setState(state: ServerState, detail = ''): void {
    if (state !== 'running') this.engine = undefined;
    this.state = state;
    this.detail = detail;
    this.stateEmitter.fire(state);
  }
}

/** The last lines a stream wrote, kept while passing them on to an output channel. */
class Tail {
  private lines: string[] = [];

  recording(channel: vscode.LogOutputChannel): vscode.LogOutputChannel {
    const record = (text: string) => {
      this.lines.push(...text.split('\n').filter((line) => line.trim() !== ''));
      this.lines = this.lines.slice(-5);
    };
    return new Proxy(channel, {
      get: (target, property, receiver) => {
        if (property === 'append' || property === 'appendLine') {
          return (text: string) => (record(text), target[property](text));
        }
        const value = Reflect.get(target, property, receiver) as unknown;
        return typeof value === 'function' ? value.bind(target) : value;
      },
    });
  }

  /** The last line that looks like an error, else the last line. */
  last(): string {
    return [...this.lines].reverse().find((line) => /error|not found|No module/i.test(line)) ?? this.lines.at(-1) ?? '';
  }
}

function message(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
