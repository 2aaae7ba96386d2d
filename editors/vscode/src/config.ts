/**
 * The extension's settings (`specedit.*`) and the command that starts the language server.
 *
 * The server reads the same section itself (workspace/configuration); keys it does not know
 * (`server`, `trace`) are the client's.
 */
import * as cp from 'child_process';
import * as fs from 'fs';
import * as path from 'path';
import * as vscode from 'vscode';
import { Delivery, NAMES } from './protocol';

export const SECTION = NAMES.configurationSection;

export interface ServerCommand {
  command: string;
  args: string[];
  /** How the user wrote it, for messages. */
  display: string;
  /** `python -m specedit.lsp`: the interpreter, so that a missing package can be told apart. */
  python?: string;
}

/** A problem that stops the server from starting, with the fix. */
export class ServerSetupError extends Error {
  constructor(
    message: string,
    readonly fix: string,
  ) {
    super(message);
  }
}

export function settings(scope?: vscode.ConfigurationScope): vscode.WorkspaceConfiguration {
  return vscode.workspace.getConfiguration(SECTION, scope);
}

export function delivery(document: vscode.TextDocument): Delivery {
  const value = settings(document).get<string>('delivery', 'live');
  return (NAMES.deliveries as readonly string[]).includes(value) ? (value as Delivery) : 'live';
}

/** Whether a preview (`previewDiff.ts`) and a live rewrite's written hunks (`writtenDiff.ts`) open their
 * diff beside the document. */
export function previewDiff(document: vscode.TextDocument): boolean {
  return settings(document).get<boolean>('previewDiff', true);
}

export function maxNewTokens(document: vscode.TextDocument): number | undefined {
  return settings(document).get<number | null>('maxNewTokens') ?? undefined;
}

export function presets(document: vscode.TextDocument): { title: string; instruction: string }[] {
  return settings(document).get<{ title: string; instruction: string }[]>('presets', []);
}

/** `specedit.server.command`, else `python -m specedit.lsp` with `specedit.server.pythonPath`, else `specedit lsp`. */
export function serverCommand(): ServerCommand {
  const config = settings();
  const command = config.get<string[]>('server.command', []).filter((part) => part !== '');
  if (command.length > 0) {
    const [program, ...args] = command.map(expandHome);
    const python = args[0] === '-m' && args[1] === 'specedit.lsp' ? program : undefined;
    return { command: program, args, display: command.join(' '), python };
  }
  const pythonPath = expandHome(config.get<string>('server.pythonPath', ''));
  if (pythonPath) {
    return { command: pythonPath, args: ['-m', 'specedit.lsp'], display: `${pythonPath} -m specedit.lsp`, python: pythonPath };
  }
  return { command: 'specedit', args: ['lsp'], display: 'specedit lsp' };
}

/** Settings whose change needs a new server process (the others the server follows by itself). */
export function needsRestart(event: vscode.ConfigurationChangeEvent): boolean {
  return event.affectsConfiguration(`${SECTION}.server`);
}

/**
 * Checks that the server can start, before starting it: the program exists, and for `python -m
 * specedit.lsp`, that this Python has specedit. Throws `ServerSetupError` with the command that fixes it.
 */
export async function checkServerCommand(server: ServerCommand): Promise<void> {
  const program = resolveProgram(server.command);
  if (program === undefined) {
    if (server.python !== undefined) {
      throw new ServerSetupError(
        `specedit: Python was not found at "${server.command}".`,
        'Set "specedit.server.pythonPath" to a Python that has specedit (python3 -m pip install specedit).',
      );
    }
    throw new ServerSetupError(
      `specedit: the language server "${server.command}" was not found (${server.display}).`,
      'Install it with "python3 -m pip install specedit", or set "specedit.server.pythonPath" (or "specedit.server.command").',
    );
  }
  if (server.python !== undefined) {
    const found = await run(program, ['-c', 'import importlib.util as u; print(u.find_spec("specedit.lsp") is not None)']);
    if (found.trim() !== 'True') {
      throw new ServerSetupError(
        `specedit: the Python at "${server.command}" does not have specedit installed.`,
        `Install it with "${program} -m pip install specedit".`,
      );
    }
  }
}

/** The program's path: as given when it has a slash, else found on the PATH; undefined when missing. */
export function resolveProgram(program: string, searchPath = process.env.PATH ?? ''): string | undefined {
  const executable = (file: string): boolean => {
    try {
      fs.accessSync(file, fs.constants.X_OK);
      return fs.statSync(file).isFile();
    } catch {
      return false;
    }
  };
  if (program.includes('/') || program.includes(path.sep)) {
    return executable(program) ? program : undefined;
  }
  const suffixes = process.platform === 'win32' ? ['.exe', '.cmd', '.bat', ''] : [''];
  for (const folder of searchPath.split(path.delimiter).filter(Boolean)) {
    for (const suffix of suffixes) {
      const candidate = path.join(folder, program + suffix);
      if (executable(candidate)) return candidate;
    }
  }
  return undefined;
}

function expandHome(value: string): string {
  const home = process.env.HOME ?? process.env.USERPROFILE;
  return home && (value === '~' || value.startsWith('~/')) ? path.join(home, value.slice(1)) : value;
}

function run(program: string, args: string[]): Promise<string> {
  return new Promise((resolve) => {
    cp.execFile(program, args, { timeout: 30_000 }, (error, stdout) => resolve(error ? '' : stdout));
  });
}
