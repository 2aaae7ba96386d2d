--- A language server inside the test's own Neovim, for specs that script what the server says: `cmd` of
--- `vim.lsp.start` may be a function that returns the RPC client. It answers initialize and shutdown,
--- keeps each document's version and text, and holds each `specedit/rewrite` request until the spec
--- answers it. What it sends goes through the plugin's real handlers.
---
---   local server = require("fake_server").new()
---   specedit.setup({ cmd = server.cmd })
---   -- a rewrite starts; then:
---   local request = server:wait_rewrite()
---   server:apply(uri, version, { { first, last, { "new line" } } })   -- workspace/applyEdit
---   server:partial(request, { hunks = {...}, written = {...} })      -- a partial result
---   server:reply(request, { status = "complete", ... })
local t = require("runner")

local M = {}

local Server = {}
Server.__index = Server

--- A fresh server. `on_command(command, arguments, server)`, when set, answers workspace/executeCommand.
function M.new()
  local server = setmetatable({ rewrites = {}, commands = {}, notifications = {}, documents = {} }, Server)
  server.cmd = function(dispatchers)
    return server:_connect(dispatchers)
  end
  return server
end

function Server:_connect(dispatchers)
  self.dispatchers = dispatchers
  local closing, next_id = false, 0
  local server = self
  local rpc = {}
  function rpc.request(method, params, callback, notify_reply_callback)
    next_id = next_id + 1
    local id = next_id
    local function reply(err, result)
      vim.schedule(function()
        callback(err, result)
        if notify_reply_callback then
          notify_reply_callback(id)
        end
      end)
    end
    if method == "initialize" then
      server.initialize_params = params
      reply(nil, {
        capabilities = {
          textDocumentSync = { openClose = true, change = 2 },
          executeCommandProvider = { commands = require("specedit.protocol").NAMES.commands },
        },
        serverInfo = { name = "fake specedit" },
      })
    elseif method == "specedit/rewrite" then
      server.rewrites[#server.rewrites + 1] = { id = id, params = params, reply = reply }
    elseif method == "workspace/executeCommand" then
      server.commands[#server.commands + 1] = params
      local answer = server.on_command and server.on_command(params.command, params.arguments or {}, server)
      reply(nil, answer or vim.empty_dict())
    else
      reply(nil, vim.NIL)
    end
    return true, id
  end
  function rpc.notify(method, params)
    server.notifications[#server.notifications + 1] = { method = method, params = params }
    if method == "textDocument/didOpen" then
      server.documents[params.textDocument.uri] = { version = params.textDocument.version }
    elseif method == "textDocument/didChange" then
      server.documents[params.textDocument.uri] = { version = params.textDocument.version }
    elseif method == "exit" then
      closing = true
      vim.schedule(function()
        dispatchers.on_exit(0, 0)
      end)
    end
    return true
  end
  function rpc.is_closing()
    return closing
  end
  function rpc.terminate()
    if not closing then
      closing = true
      vim.schedule(function()
        dispatchers.on_exit(0, 15)
      end)
    end
  end
  return rpc
end

--- Wait for the next rewrite request the server has not seen yet; returns it ({ params, reply }).
function Server:wait_rewrite()
  self.seen = self.seen or 0
  t.wait(5000, function()
    return #self.rewrites > self.seen
  end, "a rewrite request")
  self.seen = self.seen + 1
  return self.rewrites[self.seen]
end

--- A whole-line LSP range: lines `first` to `stop` (0-based, `stop` excluded).
function M.lines(first, stop)
  return { start = { line = first, character = 0 }, ["end"] = { line = stop, character = 0 } }
end

--- Send a `workspace/applyEdit` that replaces lines first..stop-1 with `lines` (each edit { first, stop,
--- lines }), at the buffer's current version; returns the client's answer.
function Server:apply(bufnr, edits)
  local text_edits = {}
  for _, edit in ipairs(edits) do
    local text = #edit[3] > 0 and table.concat(edit[3], "\n") .. "\n" or ""
    text_edits[#text_edits + 1] = { range = M.lines(edit[1], edit[2]), newText = text }
  end
  return self.dispatchers.server_request("workspace/applyEdit", {
    edit = {
      documentChanges = {
        {
          textDocument = { uri = vim.uri_from_bufnr(bufnr), version = vim.lsp.util.buf_versions[bufnr] },
          edits = text_edits,
        },
      },
    },
  })
end

--- A partial result of `request`.
function Server:partial(request, value)
  value.jobId = value.jobId or "job-1"
  value.hunks = value.hunks or {}
  value.stats = value.stats or { generated_tokens = 1, lines_done = 1, lines_total = 2 }
  self.dispatchers.notification("$/progress", { token = request.params.partialResultToken, value = value })
end

--- Where the provisional text is (lines first..stop-1 of the buffer now), or none (nil).
function Server:provisional(bufnr, first, stop)
  self.dispatchers.notification("specedit/provisional", {
    uri = vim.uri_from_bufnr(bufnr),
    version = vim.lsp.util.buf_versions[bufnr],
    jobId = "job-1",
    range = first and M.lines(first, stop) or vim.NIL,
  })
end

--- Answer `request` with its result.
function Server:reply(request, result)
  result.jobId = result.jobId or "job-1"
  result.stats = result.stats or { generated_tokens = 12, tokens_per_second = 30, acceptance_rate = 0.9 }
  request.reply(nil, result)
end

return M
