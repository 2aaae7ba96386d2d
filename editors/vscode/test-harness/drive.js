// Runs the extension's tests in code-server's VS Code: opens the workbench in headless chromium with
// `extensionDevelopmentPath` and `extensionTestsPath` in the URL's payload. code-server has no such
// command-line flags, and starts an extension host only when a browser connects. The tests run in the
// Node extension host on the server side; the workbench reports their end through
// window.codeAutomationExit(code), and their console through window.codeAutomationLog.
//
//   node drive.js <baseUrl> <workspaceDir> <extensionDevelopmentPath> <extensionTestsPath>
// A test asks for a screenshot of the workbench by logging `specedit-screenshot <name>`: it is saved as
// $SPECEDIT_VSCODE_SCREENSHOTS/<name>.png (the test waits for the file).
// Environment: CHROMIUM (default /usr/bin/chromium), SPECEDIT_VSCODE_TIMEOUT (seconds, default 300),
// SPECEDIT_VSCODE_SCREENSHOTS (a folder; no screenshots without it).
// Exit code: the tests' (0: all passed), 124 on timeout, 1 when the workbench could not be driven.
'use strict';
const fs = require('fs');
const path = require('path');
const util = require('util');
const { chromium } = require('playwright-core');

const [baseUrl, workspace, extensionPath, testsPath] = process.argv.slice(2);
const timeoutMs = 1000 * Number(process.env.SPECEDIT_VSCODE_TIMEOUT || 300);
const started = Date.now();
const log = (...args) => console.log(`[drive +${((Date.now() - started) / 1000).toFixed(1)}s]`, ...args);

async function main() {
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking',
      '--disable-component-update', '--disable-sync', '--disable-dev-shm-usage'],
  });
  try {
    const page = await browser.newPage();
    const exited = new Promise((resolve) => {
      page.exposeFunction('codeAutomationExit', (code) => resolve(code));
      page.exposeFunction('codeAutomationLog', (type, args) => {
        const line = util.format(...(args || []));
        const wanted = /^specedit-screenshot ([\w-]+)$/.exec(line);
        if (wanted) void screenshot(page, wanted[1]);
        else console.log(line);
      });
    });
    page.on('pageerror', (error) => log('page error:', error.message));
    const remote = (file) => `vscode-remote://${new URL(baseUrl).host}${file}`;
    const payload = [['extensionDevelopmentPath', remote(extensionPath)], ['extensionTestsPath', remote(testsPath)]];
    await page.goto(`${baseUrl}/?folder=${encodeURIComponent(workspace)}&payload=${encodeURIComponent(JSON.stringify(payload))}`);
    log('workbench opened; the tests run in the extension host');
    let timer;
    const timedOut = new Promise((resolve) => { timer = setTimeout(() => resolve('timeout'), timeoutMs); });
    const code = await Promise.race([exited, timedOut]);
    clearTimeout(timer);
    if (code === 'timeout') {
      log(`no result within ${timeoutMs / 1000} s`);
      return 124;
    }
    log(`the extension host exited with ${code}`);
    return Number(code);
  } finally {
    await browser.close();
  }
}

async function screenshot(page, name) {
  const folder = process.env.SPECEDIT_VSCODE_SCREENSHOTS;
  if (!folder) return;
  fs.mkdirSync(folder, { recursive: true });
  const file = path.join(folder, `${name}.png`);
  try {
    await page.screenshot({ path: `${file}.tmp.png` });
    fs.renameSync(`${file}.tmp.png`, file); // whole, or not there
    log(`screenshot: ${file}`);
  } catch (error) {
    log(`screenshot ${name} failed: ${error.message}`);
  }
}

main().then(
  (code) => process.exit(code),
  (error) => { log('error:', error && error.stack || error); process.exit(1); },
);
