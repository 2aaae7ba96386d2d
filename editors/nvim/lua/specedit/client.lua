--- The LSP client: starts `specedit lsp` with vim.lsp.start, sends our requests, and routes what the server
--- sends back. Two handlers are ours, for this client only:
---   $/progress          partial results of our rewrites go to the renderer; everything else (the work-done
---                       progress behind vim.lsp.status()) goes on to Neovim's own handler;
---   workspace/applyEdit the server's edits, applied like Neovim does, joined into one undo step per rewrite;
---   specedit/provisional where a live rewrite's unsettled text is: marked pending (preview.lua).
local config = require("specedit.config")
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
    -- One undo step per rewrite: join this edit to our previous one, if the buffer is still where that
    -- edit left it (the user neither typed nor undid since). Not allowed right after an undo: pcall.
    if jobs.undo_seq[bufnr] ~= nil and jobs.undo_seq[bufnr] == undo_seq(bufnr) then
      vim.api.nvim_buf_call(bufnr, function()
        pcall(vim.cmd.undojoin)
      end)
    end
  end
  local ok, failure = pcall(vim.lsp.util.apply_workspace_edit, params.edit, client.offset_encoding)
  for _, bufnr in ipairs(buffers) do
    if vim.api.nvim_buf_is_valid(bufnr) then
      jobs.undo_seq[bufnr] = undo_seq(bufnr)
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

M.handlers = {
  ["$/progress"] = on_progress,
  ["workspace/applyEdit"] = on_apply_edit,
  [protocol.NAMES.provisionalNotification] = on_provisional,
}

-- ----------------------------------------------------------------------------------------- starting

--- The specedit client attached to `bufnr`, if any.
function M.get(bufnr)
  local clients = vim.lsp.get_clients({ name = M.NAME, bufnr = bufnr })
  return clients[1]
end

local function settings()
  local values = config.options.settings or {}
  return next(values) == nil and vim.empty_dict() or values
end

--- Start (or reuse: one server per Neovim, it holds the model) the server and attach it to `bufnr`.
---@return integer? client_id, string? error
function M.start(bufnr)
  local cmd = config.options.cmd
  if type(cmd) ~= "table" or #cmd == 0 then
    return nil, "the server command (cmd) is empty"
  end
  if vim.fn.executable(cmd[1]) ~= 1 then
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
      return client.name == new_config.name and client.config.cmd and vim.deep_equal(client.config.cmd, new_config.cmd)
    end,
  })
  if not client_id then
    return nil, "the server did not start: " .. table.concat(cmd, " ")
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
