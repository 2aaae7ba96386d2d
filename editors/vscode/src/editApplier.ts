/**
 * Applies the server's `workspace/applyEdit` requests, so that a live rewrite is one undo step.
 *
 * The server writes a live rewrite as many small versioned edits, one per settled hunk. Applied with
 * `workspace.applyEdit`, each would be its own undo step. While a rewrite of a document is running (a
 * "group"), its edits go through the document's editor with no undo stop between them, so one Ctrl+Z
 * takes the whole rewrite back. Everything else (no visible editor, several files, an edit the server
 * wants confirmed) takes VS Code's ordinary path.
 *
 * Edits are versioned: an edit computed for another version of the document is refused (`applied:
 * false`), as VS Code does, and the server plans it again on the current text.
 */
import * as vscode from 'vscode';
import { LanguageClient } from 'vscode-languageclient/node';
import {
  ApplyWorkspaceEditParams,
  ApplyWorkspaceEditResult,
  TextDocumentEdit,
  WorkspaceEdit,
} from 'vscode-languageclient';

interface Group {
  rewrites: number; // running rewrites of the document
  edits: number; // edits applied since the group opened
}

export class EditApplier {
  private readonly groups = new Map<string, Group>();
  private readonly applied = new Map<string, number>(); // uri -> edits applied so far
  private queue: Promise<unknown> = Promise.resolve();

  /** A live rewrite of `uri` starts: its edits are one undo step, until `close`. */
  open(uri: vscode.Uri): void {
    const group = this.groups.get(uri.toString()) ?? { rewrites: 0, edits: 0 };
    group.rewrites += 1;
    this.groups.set(uri.toString(), group);
  }

  close(uri: vscode.Uri): void {
    const group = this.groups.get(uri.toString());
    if (group && --group.rewrites <= 0) this.groups.delete(uri.toString());
  }

  /** How many of the server's edits have been applied to `uri` so far. */
  appliedCount(uri: vscode.Uri): number {
    return this.applied.get(uri.toString()) ?? 0;
  }

  /** The handler for `workspace/applyEdit`; edits are applied one at a time, in the order they came. */
  handle(client: LanguageClient, params: ApplyWorkspaceEditParams): Promise<ApplyWorkspaceEditResult> {
    const next = this.queue.then(() => this.apply(client, params)).then((result) => {
      for (const uri of result.applied ? touchedUris(client, params.edit) : []) {
        this.applied.set(uri, (this.applied.get(uri) ?? 0) + 1);
      }
      return result;
    });
    this.queue = next.catch(() => undefined);
    return next;
  }

  private async apply(client: LanguageClient, params: ApplyWorkspaceEditParams): Promise<ApplyWorkspaceEditResult> {
    const change = singleDocumentEdit(params.edit);
    const editor = change && visibleEditor(client.protocol2CodeConverter.asUri(change.textDocument.uri));
    if (!change || !editor) return this.applyOrdinary(client, params.edit);
    const document = editor.document;
    if (change.textDocument.version !== null && change.textDocument.version !== document.version) {
      return { applied: false, failureReason: `the document is at version ${document.version}` };
    }
    const group = this.groups.get(document.uri.toString());
    const edits = change.edits.map((edit) => ({
      range: client.protocol2CodeConverter.asRange(edit.range),
      newText: edit.newText,
    }));
    const applied = await editor.edit(
      (builder) => edits.forEach((edit) => builder.replace(edit.range, edit.newText)),
      // In a group: an undo stop before its first edit only. Otherwise one undo step per edit.
      { undoStopBefore: group === undefined || group.edits === 0, undoStopAfter: group === undefined },
    );
    if (applied && group) group.edits += 1;
    return { applied };
  }

  /** VS Code's own path, with the version check vscode-languageclient makes. */
  private async applyOrdinary(client: LanguageClient, edit: WorkspaceEdit): Promise<ApplyWorkspaceEditResult> {
    for (const change of edit.documentChanges ?? []) {
      if (!TextDocumentEdit.is(change) || change.textDocument.version === null) continue;
      const uri = client.protocol2CodeConverter.asUri(change.textDocument.uri).toString();
      const document = vscode.workspace.textDocuments.find((doc) => doc.uri.toString() === uri);
      if (document && document.version !== change.textDocument.version) return { applied: false };
    }
    const converted = await client.protocol2CodeConverter.asWorkspaceEdit(edit);
    return { applied: await vscode.workspace.applyEdit(converted) };
  }
}

/** The edit's only change, when it is a text edit of one document that nobody has to confirm. */
function singleDocumentEdit(edit: WorkspaceEdit): TextDocumentEdit | undefined {
  const changes = edit.documentChanges ?? [];
  if (changes.length !== 1 || edit.changes !== undefined || !TextDocumentEdit.is(changes[0])) return undefined;
  const annotations = edit.changeAnnotations ?? {};
  if (Object.values(annotations).some((annotation) => annotation.needsConfirmation)) return undefined;
  return changes[0];
}

function touchedUris(client: LanguageClient, edit: WorkspaceEdit): string[] {
  const uris = (edit.documentChanges ?? []).flatMap((change) => (TextDocumentEdit.is(change) ? [change.textDocument.uri] : []));
  return [...uris, ...Object.keys(edit.changes ?? {})].map((uri) => client.protocol2CodeConverter.asUri(uri).toString());
}

function visibleEditor(uri: vscode.Uri): vscode.TextEditor | undefined {
  const key = uri.toString();
  const active = vscode.window.activeTextEditor;
  if (active?.document.uri.toString() === key) return active;
  return vscode.window.visibleTextEditors.find((editor) => editor.document.uri.toString() === key);
}
