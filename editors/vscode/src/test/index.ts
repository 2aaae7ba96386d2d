/**
 * The extension tests' entry: VS Code's extension host calls `run()` (extensionTestsPath), which runs
 * every `*.test.js` next to this file with mocha. `SPECEDIT_VSCODE_GREP` selects tests by name.
 */
import * as fs from 'fs';
import Mocha from 'mocha';
import * as path from 'path';

export function run(): Promise<void> {
  const mocha = new Mocha({
    ui: 'tdd',
    color: false,
    timeout: Number(process.env.SPECEDIT_VSCODE_TEST_TIMEOUT_MS ?? 60_000),
    grep: process.env.SPECEDIT_VSCODE_GREP || undefined,
  });
  for (const file of fs.readdirSync(__dirname).filter((name) => name.endsWith('.test.js')).sort()) {
    mocha.addFile(path.join(__dirname, file));
  }
  return new Promise((resolve, reject) => {
    mocha.run((failures) => (failures > 0 ? reject(new Error(`${failures} test(s) failed`)) : resolve()));
  });
}
