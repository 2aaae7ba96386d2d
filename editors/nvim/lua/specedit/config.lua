--- specedit's options: the defaults below, with whatever `require("specedit").setup(opts)` gives on top.
local M = {}

---@class specedit.Options
M.defaults = {
  --- The language server, started with `vim.lsp.start` (stdio). `specedit lsp` must be on the PATH, or give
  --- the full command, e.g. { "/path/to/venv/bin/specedit", "lsp", "--model", "/models/coder" }. A function
  --- is passed on as `vim.lsp.start` takes it, e.g. vim.lsp.rpc.connect("127.0.0.1", 2087).
  cmd = { "specedit", "lsp" },
  --- The model the server runs: a known name ("qwen2.5-coder-1.5b-instruct"), a model folder or a .gguf
  --- file. nil: the server's default (Qwen2.5-Coder-0.5B-Instruct). A known name is fetched on first use.
  --- The same as `settings.model`; this one wins.
  model = nil,
  --- Filetypes whose buffers get the server as soon as they open (its code actions then show up in
  --- `vim.lsp.buf.code_action()`). Empty: the server attaches to a buffer on its first rewrite, any filetype.
  filetypes = {},
  --- How a rewrite reaches the buffer, unless `rewrite({ delivery = ... })` says otherwise:
  ---   "live"    the server writes the new lines while they are generated (one undo step per rewrite);
  ---   "preview" the new lines show as virtual lines; :SpeceditAccept writes them, :SpeceditReject drops them;
  ---   "final"   one edit at the end.
  delivery = "live",
  --- Server settings (the `specedit` section: engine, model, dtype, weights, kvCache, device, draft, draftModel,
  --- draftLayers, pMin, prefixCacheMb, presets, maxNewTokens, warm, loadOnStart),
  --- sent as `initializationOptions` and answered to `workspace/configuration`. Flags in `cmd` win.
  settings = {},
  --- A short message (vim.notify) when a rewrite ends, with its speed and acceptance rate.
  notify = true,
  --- Milliseconds Neovim waits before sending buffer changes to the server. Live edits are confirmed by
  --- their echo in didChange, so a live rewrite writes one hunk per this interval at most.
  debounce_text_changes = 50,
  --- Milliseconds to wait for the server to start and attach before a rewrite gives up.
  start_timeout = 60000,
  --- Buffer-local keymaps (normal mode), set while a rewrite's hunks are shown (a preview, or what a live
  --- rewrite wrote) and removed after; `keymaps = false` sets none, a key set to false leaves that one out.
  keymaps = {
    accept_hunk = "<leader>ha", -- :SpeceditAcceptHunk
    reject_hunk = "<leader>hr", -- :SpeceditRejectHunk
    next_hunk = "]h", -- :SpeceditNextHunk
    prev_hunk = "[h", -- :SpeceditPrevHunk
  },
  --- Highlight groups of previews and written hunks (linked to the Diff* groups unless you define them).
  highlights = {
    added = "SpeceditAdded", -- the new lines (virtual in a preview)
    removed = "SpeceditRemoved", -- the lines they replace (virtual once a live rewrite wrote the new ones)
    hint = "SpeceditHint", -- the "accept / reject" hint
    pending = "SpeceditPending", -- a live rewrite's lines still being written (not settled yet)
  },
}

---@type specedit.Options
M.options = vim.deepcopy(M.defaults)

--- Merge `opts` over the defaults (not over earlier options: calling setup twice with the same options
--- gives the same result).
---@param opts? table
function M.set(opts)
  opts = opts or {}
  if opts.keymaps ~= nil and opts.keymaps ~= false and type(opts.keymaps) ~= "table" then
    error("specedit.setup: keymaps must be a table or false", 3)
  end
  for _, key in ipairs({ "filetypes", "settings", "highlights" }) do
    if opts[key] ~= nil and type(opts[key]) ~= "table" then
      error(("specedit.setup: %s must be a table"):format(key), 3)
    end
  end
  if opts.cmd ~= nil and type(opts.cmd) ~= "table" and type(opts.cmd) ~= "function" then
    error("specedit.setup: cmd must be a list or a function", 3)
  end
  if opts.model ~= nil and type(opts.model) ~= "string" then
    error("specedit.setup: model must be a string", 3)
  end
  if opts.delivery ~= nil and not vim.tbl_contains({ "live", "preview", "final" }, opts.delivery) then
    error("specedit.setup: delivery must be live, preview or final", 3)
  end
  M.options = vim.tbl_deep_extend("force", vim.deepcopy(M.defaults), opts)
  if opts.cmd then
    M.options.cmd = type(opts.cmd) == "table" and vim.deepcopy(opts.cmd) or opts.cmd -- never merged by index
  end
  if opts.filetypes then
    M.options.filetypes = vim.deepcopy(opts.filetypes)
  end
  return M.options
end

--- The server's settings (the `specedit` section): `settings`, with `model` on top.
---@return table
function M.server_settings()
  local values = vim.deepcopy(M.options.settings or {})
  if M.options.model and M.options.model ~= "" then
    values.model = M.options.model
  end
  return values
end

return M
