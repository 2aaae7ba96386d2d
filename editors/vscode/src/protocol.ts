/**
 * specedit's LSP extensions, as the server declares them in `lsp/protocol.py`.
 *
 * `NAMES` is a copy of the Python `NAMES`; tests/test_vscode.py keeps the two equal. See protocol.py for
 * the meaning of each field.
 */

export const NAMES = {
  rewriteMethod: 'specedit/rewrite',
  provisionalNotification: 'specedit/provisional',
  engineNotification: 'specedit/engine',
  commands: ['specedit.rewrite', 'specedit.accept', 'specedit.reject', 'specedit.cancel'],
  configurationSection: 'specedit',
  codeActionKind: 'refactor.rewrite',
  deliveries: ['live', 'preview', 'final'],
  statuses: ['complete', 'cancelled', 'superseded', 'conflict', 'error'],
  engineStates: ['loading', 'ready', 'failed'],
} as const;

export const REWRITE_METHOD = NAMES.rewriteMethod;
export const [COMMAND_REWRITE, COMMAND_ACCEPT, COMMAND_REJECT, COMMAND_CANCEL] = NAMES.commands;

export type Delivery = (typeof NAMES.deliveries)[number];
export type Status = (typeof NAMES.statuses)[number];
export type EngineState = (typeof NAMES.engineStates)[number];

export interface Position {
  line: number;
  character: number;
}

export interface Range {
  start: Position;
  end: Position;
}

export interface RewriteParams {
  textDocument: { uri: string; version?: number };
  range?: Range; // absent: the whole document
  instruction?: string; // exactly one of instruction and sketch
  sketch?: string;
  delivery?: Delivery;
  maxNewTokens?: number;
  partialResultToken?: string | number;
  workDoneToken?: string | number;
}

/** A whole-line replacement, in the coordinates of the request's document version (in `written` and
 * `offered`: of theirs). */
export interface HunkPayload {
  id: number;
  range: Range;
  newText: string;
  oldText: string; // the whole lines it replaces, as they were at the request's version
}

export interface LiveStats {
  phase?: 'starting' | 'loading' | 'queued' | 'started' | 'writing';
  seconds?: number; // since the request
  message?: string; // what the server says the rewrite is doing, ready to show
  generated_tokens: number;
  tokens_per_second: number;
  acceptance_rate: number;
  target_forwards?: number;
  lines_done: number;
  lines_total: number;
}

/** Where a rewrite's hunks are in the document at `version`: their new text (`written`), or their old
 * text (`offered`). */
export interface WrittenHunks {
  version: number;
  hunks: HunkPayload[];
}

export interface RewritePartialResult {
  jobId: string;
  hunks: HunkPayload[];
  stats: LiveStats;
  delivery?: Delivery; // the job's delivery now ("preview" once a live rewrite became one)
  written?: WrittenHunks; // a live rewrite's hunks written so far, where they are now
}

export interface RewriteResult {
  jobId: string;
  status: Status;
  stats: Record<string, unknown>;
  hunks?: HunkPayload[]; // only when no partialResultToken was given
  written?: WrittenHunks; // what a live or final rewrite wrote, each hunk undoable
  offered?: WrittenHunks; // a live rewrite that became a preview: its hunks, each one acceptable
  delivery?: Delivery; // the delivery it ended with ("preview" where a live rewrite became one)
  message?: string; // for conflict and error, and why a live rewrite became a preview
  error?: { code: number; message: string; data?: unknown };
  stepsAfterCancel?: number;
}

/** Where a live rewrite's provisional text is in the document at `version` (range null: none left). */
export interface ProvisionalParams {
  uri: string;
  version: number;
  jobId: string;
  range: Range | null;
}

/** The engine's state, for the status item: `loading` (fetching or loading the model, `message` says
 * which), `ready`, or `failed` (`message`: the error). */
export interface EngineParams {
  state: EngineState;
  message: string;
}

export interface JobSelector {
  jobId?: string;
  uri?: string;
  hunks?: number[];
}

export interface EditResult {
  jobId: string;
  applied: number[]; // written (accept) or restored (reject)
  skipped: number[]; // edited by the user since: left alone
}
