/**
 * The view follows a live rewrite's writing position, so that a whole-file rewrite does not stream
 * off-screen, until the user scrolls away from it. Scrolled away: none of the new line and the two
 * revealed last is in view (the writing moves down; the view the extension host knows may lag one
 * reveal behind).
 */
import * as vscode from 'vscode';

export class FollowWriting {
  private readonly revealed = new Map<string, number[] | 'away'>(); // uri -> the lines revealed last

  /** A live rewrite of `uri` starts: followed from its first line written. */
  start(uri: vscode.Uri): void {
    this.revealed.set(uri.toString(), []);
  }

  stop(uri: vscode.Uri): void {
    this.revealed.delete(uri.toString());
  }

  /** The rewrite of `uri` writes at `line`: every editor of it shows that line, unless the user scrolled away. */
  to(uri: vscode.Uri, line: number): void {
    const last = this.revealed.get(uri.toString());
    if (last === undefined || last === 'away') return;
    const editors = vscode.window.visibleTextEditors.filter((editor) => editor.document.uri.toString() === uri.toString());
    if (editors.length === 0) return;
    const inView = (editor: vscode.TextEditor, at: number) =>
      editor.visibleRanges.some((range) => range.start.line <= at && at <= range.end.line);
    // The editor the user works in says whether they scrolled away: the active one, else the first.
    const main = editors.find((editor) => editor === vscode.window.activeTextEditor) ?? editors[0];
    if (last.length > 0 && ![...last, line].some((at) => inView(main, at))) {
      this.revealed.set(uri.toString(), 'away');
      return;
    }
    const at = new vscode.Range(line, 0, line, 0);
    for (const editor of editors) editor.revealRange(at, vscode.TextEditorRevealType.InCenterIfOutsideViewport);
    this.revealed.set(uri.toString(), [...last, line].slice(-2));
  }

  /** Whether the view of `uri` still follows its writing (for the extension's API and its tests). */
  following(uri: vscode.Uri): boolean {
    const last = this.revealed.get(uri.toString());
    return last !== undefined && last !== 'away';
  }
}
