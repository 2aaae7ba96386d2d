--- The LSP client: starts `specedit lsp` with vim.lsp.start, sends our requests, and routes what the server
--- sends back. These handlers are ours, for this client only:
---   $/progress          partial results of our rewrites go to the renderer; everything else (the work-done
---                       progress behind vim.lsp.status()) goes on to Neovim's own handler;
---   workspace/applyEdit the server's edits, applied like Neovim does, joined into one undo step per rewrite;
---   specedit/provisional where a live rewrite's unsettled text is: marked pending (preview.lua);
---   specedit/engine     the engine's state (the model fetched or loaded, ready, failed), for status().
local config = require("specedit.config")
local follow = require("specedit.follow")
local jobs = require("specedit.jobs")
local protocol = require("specedit.protocol")

local M = {}

M.NAME = "specedit"

local has_011 = vim.fn.has("nvim-0.11") == 1

-- Neovim 0.11 made the client's functions methods (client:request); 0.10 has plain fields (client.request).
local function call(client, name, ...)
  if has_011 then
    return client[name](client, ...)
  end
  return client[name](...)
end

---@return boolean ok, integer? request_id
function M.request(client, method, params, handler, bufnr)
  return call(client, "request", method, params, handler, bufnr)
end

function M.cancel_request(client, request_id)
  return call(client, "cancel_request", request_id)
end

function M.execute(client, bufnr, command, arguments, handler)
  return M.request(client, "workspace/executeCommand", { command = command, arguments = arguments }, handler, bufnr)
end

-- ------------------------------------------------------------------------------------------ handlers

local function on_progress(err, params, ctx, handler_config)
  local job = params and jobs.for_token(params.token)
  if job and type(params.value) == "table" and params.value.kind == nil then
    require("specedit")._on_partial(job, params.value)
    return
  end
  return vim.lsp.handlers["$/progress"](err, params, ctx, handler_config)
end

-- The buffers a workspace edit touches.
local function edited_buffers(edit)
  local uris = {}
  for _, change in ipairs(edit.documentChanges or {}) do
    if change.textDocument then
      uris[change.textDocument.uri] = true
    end
  end
  for uri in pairs(edit.changes or {}) do
    uris[uri] = true
  end
  local buffers = {}
  for uri in pairs(uris) do
    buffers[#buffers + 1] = vim.uri_to_bufnr(uri)
  end
  return buffers
end

--- The buffer's current undo sequence number.
function M.undo_seq(bufnr)
  return vim.api.nvim_buf_call(bufnr, function()
    return vim.fn.undotree().seq_cur
  end)
end
local undo_seq = M.undo_seq

--- The length of `text` in the units of `encoding` ("utf-8", "utf-16" or "utf-32").
function M.units(text, encoding)
  if encoding ~= "utf-16" and encoding ~= "utf-32" then
    return #text
  end
  if has_011 then
    return vim.str_utfindex(text, encoding)
  end
  local utf32, utf16 = vim.str_utfindex(text)
  return encoding == "utf-16" and utf16 or utf32
end

-- Neovim applies an edit that ends past the last line (at the start of the line after it, as whole-line
-- edits do) in two changes: the text with an empty line after it, then that line deleted. They may reach
-- the server in two didChange notifications, and the server would take the second for the user's typing.
-- Such an edit is rewritten here to end at the end of the last line, which Neovim applies in one change.
local function within_lines(bufnr, edits, encoding)
  local count = vim.api.nvim_buf_line_count(bufnr)
  local at_end = {}
  for index, edit in ipairs(edits) do
    if edit.range["end"].line >= count then
      at_end[#at_end + 1] = index
    end
  end
  if #at_end ~= 1 or not vim.bo[bufnr].eol then
    return edits
  end
  local edit = edits[at_end[1]]
  local start, text = edit.range.start, edit.newText
  local last_line = vim.api.nvim_buf_get_lines(bufnr, count - 1, count, true)[1]
  local last = { line = count - 1, character = M.units(last_line, encoding) }
  local without_eol = text:gsub("\r?\n$", "")
  local rewritten
  if start.line >= count and without_eol ~= text then -- lines added after the last one
    rewritten = { range = { start = last, ["end"] = last }, newText = "\n" .. without_eol }
  elseif start.line < count and without_eol ~= text then -- the last lines replaced
    rewritten = { range = { start = start, ["end"] = last }, newText = without_eol }
  elseif start.line < count and start.line > 0 and start.character == 0 and text == "" and #edits == 1 then
    local before = vim.api.nvim_buf_get_lines(bufnr, start.line - 1, start.line, true)[1] -- the last lines deleted
    local from = { line = start.line - 1, character = M.units(before, encoding) }
    rewritten = { range = { start = from, ["end"] = last }, newText = "" }
  end
  if not rewritten then
    return edits
  end
  edits = vim.list_extend({}, edits)
  edits[at_end[1]] = rewritten
  return edits
end

-- `edit` (a WorkspaceEdit) with its edits kept within the lines of their buffers (`within_lines`).
local function applicable(edit, encoding)
  local changes = {}
  for _, change in ipairs(edit.documentChanges or {}) do
    if change.textDocument and change.edits then
      local bufnr = vim.uri_to_bufnr(change.textDocument.uri)
      if vim.api.nvim_buf_is_loaded(bufnr) then
        change = vim.tbl_extend("force", change, { edits = within_lines(bufnr, change.edits, encoding) })
      end
    end
    changes[#changes + 1] = change
  end
  return edit.documentChanges and vim.tbl_extend("force", edit, { documentChanges = changes }) or edit
end

-- An edit computed for an older version of its buffer (the user typed meanwhile).
local function stale(edit)
  for _, change in ipairs(edit.documentChanges or {}) do
    local document = change.textDocument
    if document and document.version and document.version > 0 then
      local version = vim.lsp.util.buf_versions[vim.uri_to_bufnr(document.uri)]
      if version and version > document.version then
        return true
      end
    end
  end
  return false
end

local function on_apply_edit(_, params, ctx)
  local client = vim.lsp.get_client_by_id(ctx.client_id)
  if not (client and params and params.edit) then
    return { applied = false, failureReason = "no edit" }
  end
  if stale(params.edit) then
    -- Skipped, and answered `applied: true`, as Neovim's own handler does (minus its message): the server
    -- sees no echo of the edit in didChange and sends it again, rebased. Answering `false` would be no
    -- better: the user's change may still sit in the didChange debounce, and the server would take the
    -- refusal of an up-to-date edit as final.
    return { applied = true }
  end
  local buffers = edited_buffers(params.edit)
  for _, bufnr in ipairs(buffers) do
    vim.fn.bufload(bufnr)
    follow.check(bufnr) -- the user moved since our last change: the view is theirs
    -- One undo step per rewrite: join this edit to our previous one, if the buffer is still where that
    -- edit left it (the user neither typed nor undid since). Not allowed right after an undo: pcall.
    if jobs.undo_seq[bufnr] ~= nil and jobs.undo_seq[bufnr] == undo_seq(bufnr) then
      vim.api.nvim_buf_call(bufnr, function()
        pcall(vim.cmd.undojoin)
      end)
    end
  end
  local edit = applicable(params.edit, client.offset_encoding)
  local ok, failure = pcall(vim.lsp.util.apply_workspace_edit, edit, client.offset_encoding)
  for _, bufnr in ipairs(buffers) do
    if vim.api.nvim_buf_is_valid(bufnr) then
      jobs.undo_seq[bufnr] = undo_seq(bufnr)
      follow.settle(bufnr)
    end
  end
  if not ok then
    return { applied = false, failureReason = tostring(failure) }
  end
  return { applied = true }
end

local function on_provisional(_, params)
  if params then
    require("specedit")._on_provisional(params)
  end
end

--- The engine's state, as the server last said it: { state = "loading"|"ready"|"failed", message }.
---@type { state: string, message: string }?
M.engine = nil

local function on_engine(_, params)
  if type(params) == "table" then
    M.engine = params
    vim.cmd.redrawstatus({ bang = true }) -- a statusline showing status() says it
  end
end

M.handlers = {
  ["$/progress"] = on_progress,
  ["workspace/applyEdit"] = on_apply_edit,
  [protocol.NAMES.provisionalNotification] = on_provisional,
  [protocol.NAMES.engineNotification] = on_engine,
}

-- ----------------------------------------------------------------------------------------- starting

--- The specedit client attached to `bufnr`, if any.
function M.get(bufnr)
  local clients = vim.lsp.get_clients({ name = M.NAME, bufnr = bufnr })
  return clients[1]
end

local function settings()
  local values = config.server_settings()
  return next(values) == nil and vim.empty_dict() or values
end

--- Send the current settings to the running servers (after `setup()` changed them): the next rewrite
--- runs with them, the model included.
function M.configure()
  local values = settings()
  for _, client in ipairs(vim.lsp.get_clients({ name = M.NAME })) do
    client.settings = { specedit = values }
    client.config.settings = client.settings
    call(client, "notify", "workspace/didChangeConfiguration", { settings = client.settings })
  end
end

--- Start (or reuse: one server per Neovim, it holds the model) the server and attach it to `bufnr`.
---@return integer? client_id, string? error
function M.start(bufnr)
  local cmd = config.options.cmd
  if type(cmd) == "table" and #cmd == 0 or type(cmd) ~= "table" and type(cmd) ~= "function" then
    return nil, "the server command (cmd) is empty"
  end
  if type(cmd) == "table" and vim.fn.executable(cmd[1]) ~= 1 then
    return nil, ("the server %q is not executable or not on the PATH (see :checkhealth specedit)"):format(cmd[1])
  end
  local client_id = vim.lsp.start({
    name = M.NAME,
    cmd = cmd,
    root_dir = vim.fs.root(bufnr, { ".git" }) or vim.fn.getcwd(),
    init_options = settings(),
    settings = { specedit = settings() },
    handlers = M.handlers,
    flags = { debounce_text_changes = config.options.debounce_text_changes },
    on_exit = function(code, signal, client_id)
      vim.schedule(function()
        require("specedit")._on_exit(client_id, code, signal)
      end)
    end,
  }, {
    bufnr = bufnr,
    reuse_client = function(client, new_config)
      local cmd = client.config.cmd
      return client.name == new_config.name and cmd ~= nil and vim.deep_equal(cmd, new_config.cmd)
    end,
  })
  if not client_id then
    return nil, "the server did not start: " .. (type(cmd) == "table" and table.concat(cmd, " ") or "cmd()")
  end
  return client_id
end

--- Call `callback(client)` once the server runs, is initialized and knows the buffer (didOpen sent), or
--- `callback(nil, message)` when it cannot start or does not answer within `start_timeout`.
function M.ensure(bufnr, callback)
  local client_id, problem = M.start(bufnr)
  if not client_id then
    return callback(nil, problem)
  end
  local deadline = vim.uv.now() + config.options.start_timeout
  local timer = assert(vim.uv.new_timer())
  local function check()
    local client = vim.lsp.get_client_by_id(client_id)
    if not client or call(client, "is_stopped") then
      timer:close()
      return callback(nil, "the server exited (see :checkhealth specedit and :LspLog)")
    end
    if client.initialized and vim.lsp.buf_is_attached(bufnr, client_id) then
      timer:close()
      return callback(client)
    end
    if vim.uv.now() > deadline then
      timer:close()
      return callback(nil, "the server did not start in time")
    end
  end
  timer:start(0, 20, vim.schedule_wrap(function()
    if not timer:is_closing() then
      check()
    end
  end))
end

--- With `filetypes` configured: attach the server to those buffers as they open.
function M.autostart()
  local group = vim.api.nvim_create_augroup("specedit", { clear = true })
  local filetypes = config.options.filetypes or {}
  if #filetypes == 0 then
    return
  end
  vim.api.nvim_create_autocmd("FileType", {
    group = group,
    pattern = filetypes,
    callback = function(args)
      if vim.bo[args.buf].buftype == "" then
        M.start(args.buf)
      end
    end,
  })
end

return M
