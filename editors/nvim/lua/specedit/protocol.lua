--- The names of specedit's LSP extensions: a copy of `specedit.lsp.protocol.NAMES` (lsp/protocol.py).
--- tests/test_nvim.py keeps the two equal; change them there first.
local M = {}

M.NAMES = {
  rewriteMethod = "specedit/rewrite",
  provisionalNotification = "specedit/provisional",
  engineNotification = "specedit/engine",
  engineStates = { "loading", "ready", "failed" },
  commands = { "specedit.rewrite", "specedit.accept", "specedit.reject", "specedit.cancel" },
  configurationSection = "specedit",
  codeActionKind = "refactor.rewrite",
  deliveries = { "live", "preview", "final" },
  statuses = { "complete", "cancelled", "superseded", "conflict", "error" },
}

M.REWRITE = M.NAMES.rewriteMethod
M.COMMAND_REWRITE = M.NAMES.commands[1]
M.COMMAND_ACCEPT = M.NAMES.commands[2]
M.COMMAND_REJECT = M.NAMES.commands[3]
M.COMMAND_CANCEL = M.NAMES.commands[4]

return M
