// Builds the extension into one file, dist/extension.js (vscode-languageclient bundled in), and the
// tests into dist/test/ (one file each; mocha and vscode stay external: the extension host provides them).
//   node esbuild.mjs [--production] [--watch]
import * as esbuild from 'esbuild';
import { readdirSync } from 'fs';

const production = process.argv.includes('--production');
const watch = process.argv.includes('--watch');
const common = {
  bundle: true,
  platform: 'node',
  target: 'node20',
  format: 'cjs',
  external: ['vscode'],
  sourcemap: !production,
  minify: production,
  logLevel: 'warning',
};
const builds = [{ ...common, entryPoints: ['src/extension.ts'], outfile: 'dist/extension.js' }];
if (!production) {
  const tests = readdirSync('src/test').filter((name) => name.endsWith('.ts')).map((name) => `src/test/${name}`);
  builds.push({ ...common, entryPoints: tests, outdir: 'dist/test', external: ['vscode', 'mocha'] });
}
for (const options of builds) {
  if (watch) await (await esbuild.context(options)).watch();
  else await esbuild.build(options);
}
