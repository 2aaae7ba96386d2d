/**
 * specedit's LSP extensions, as the server declares them in `lsp/protocol.py`.
 *
 * `NAMES` is a copy of the Python `NAMES`; tests/test_vscode.py keeps the two equal. See protocol.py for
 * the meaning of each field.
 */

export const NAMES = {
  rewriteMethod: 'specedit/rewrite',
  provisionalNotification: 'specedit/provisional',
  commands: ['specedit.rewrite', 'specedit.accept', 'specedit.reject', 'specedit.cancel'],
  configurationSection: 'specedit',
  codeActionKind: 'refactor.rewrite',
  deliveries: ['live', 'preview', 'final'],
  statuses: ['complete', 'cancelled', 'superseded', 'conflict', 'error'],
} as const;

export const REWRITE_METHOD = NAMES.rewriteMethod;
export const [COMMAND_REWRITE, COMMAND_ACCEPT, COMMAND_REJECT, COMMAND_CANCEL] = NAMES.commands;

export type Delivery = (typeof NAMES.deliveries)[number];
export type Status = (typeof NAMES.statuses)[number];

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

/** A whole-line replacement, in the coordinates of the request's document version. */
export interface HunkPayload {
  id: number;
  range: Range;
  newText: string;
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

export interface RewritePartialResult {
  jobId: string;
  hunks: HunkPayload[];
  stats: LiveStats;
}

/** Where a rewrite's written hunks are in the document at `version` (their new text). */
export interface WrittenHunks {
  version: number;
  hunks: HunkPayload[];
}

export interface RewriteResult {
  jobId: string;
  status: Status;
  stats: Record<string, unknown>;
  hunks?: HunkPayload[]; // only when no partialResultToken was given
  written?: WrittenHunks; // what a live or final rewrite wrote, each hunk undoable
  message?: string;
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
