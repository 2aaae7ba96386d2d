--- specedit for Neovim: rewrite a buffer or a range with a language model, streamed in by `specedit lsp`.
---
---   require("specedit").setup({ cmd = { "specedit", "lsp" } })       -- optional
---   require("specedit").rewrite({ instruction = "Add type hints", range = { 10, 20 } })
---   require("specedit").accept() / reject() / cancel()
---
--- The server does the work (generating, diffing into hunks, versioned edits, cancellation); this plugin
--- starts it, forwards requests, and renders.
local client = require("specedit.client")
local config = require("specedit.config")
local follow = require("specedit.follow")
local hunks = require("specedit.hunks")
local jobs = require("specedit.jobs")
local preview = require("specedit.preview")
local protocol = require("specedit.protocol")

local M = {}

-- Neovim's own vim.notify echoes in the command line, where a message wider than the room left there
-- stops everything with "Press ENTER". A notifier plugin that replaced it shows the whole message.
local function one_line(message)
  message = message:gsub("%s*\n%s*", " ")
  local source = debug.getinfo(vim.notify, "S").source
  local room = vim.v.echospace
  if not source:find("vim/_editor.lua", 1, true) or room <= 0 or vim.fn.strdisplaywidth(message) <= room then
    return message
  end
  local kept, width = {}, 1 -- the room "…" takes
  for _, char in ipairs(vim.fn.split(message, "\\zs")) do
    width = width + vim.fn.strdisplaywidth(char)
    if width > room then
      break
    end
    kept[#kept + 1] = char
  end
  return table.concat(kept) .. "…"
end

-- One message, on one line. `always`: even with `notify = false` (the answer to something the user did).
local function notify(message, level, always)
  if config.options.notify or always then
    vim.notify(one_line(message), level or vim.log.levels.INFO, { title = "specedit" })
  end
end

local function fire(pattern, data)
  vim.api.nvim_exec_autocmds("User", { pattern = pattern, modeline = false, data = data })
end

--- Set the options (see `:help specedit-options`); optional. Calling it again replaces the options, and a
--- running server gets the new settings (the model included) for its next rewrite.
---@param opts? table
function M.setup(opts)
  config.set(opts)
  preview.define_highlights()
  client.autostart()
  client.configure()
  return M
end

-- ------------------------------------------------------------------------------------------ rewrite

-- The LSP range of lines `first`..`last` (1-based, inclusive): from the start of `first` to the start of
-- the line after `last` (or the end of the buffer, when `last` is its last line and it has no final newline).
local function line_range(bufnr, first, last, encoding)
  local count = vim.api.nvim_buf_line_count(bufnr)
  first, last = math.max(1, math.min(first, count)), math.max(1, math.min(last, count))
  if first > last then
    first, last = last, first
  end
  local stop = { line = last, character = 0 }
  if last == count and not vim.bo[bufnr].eol then
    local text = vim.api.nvim_buf_get_lines(bufnr, last - 1, last, true)[1]
    stop = { line = last - 1, character = client.units(text, encoding) }
  end
  return { start = { line = first - 1, character = 0 }, ["end"] = stop }, first - 1, last - 1
end

-- "123 tokens · 45 tok/s · 98% accepted", or how a sketch was merged.
local function summary(stats)
  stats = stats or {}
  if stats.merge == "lines" then
    return "merged by its lines, without the model"
  end
  return ("%d tokens · %.0f tok/s · %.0f%% accepted"):format(
    stats.generated_tokens or 0,
    stats.tokens_per_second or 0,
    100 * (stats.acceptance_rate or 0)
  )
end

-- A live rewrite the server turned into a preview (its answer removes most of the region, or the user
-- cancelled it): the server has taken out what it wrote; its hunks show as a preview, where their old
-- text is now.
local function become_preview(job, offered)
  job.delivery, job.offered = "preview", true
  follow.stop(job)
  preview.pending(job.bufnr, nil)
  hunks.unmark_written(job)
  if type(offered) ~= "table" or not vim.api.nvim_buf_is_valid(job.bufnr) then
    return
  end
  job.anchors = nil -- the ranges are in the document's coordinates now, not the request's
  job.hunks = offered.hunks or {}
  if vim.lsp.util.buf_versions[job.bufnr] == offered.version and #job.hunks > 0 then
    preview.add(job, job.hunks)
    hunks.keymaps(job.bufnr, true)
  end
end

-- `message` with `hint` after it, if both fit the command line.
local function with_hint(message, hint)
  local room = vim.v.echospace
  return (room <= 0 or vim.fn.strdisplaywidth(message .. hint) <= room) and message .. hint or message
end

-- What the end of a rewrite says, in one line.
local function ending_message(job, result)
  local status = result.status
  if job.rejected then
    return "specedit: rejected"
  elseif job.offered then
    if next(job.marks) == nil then
      return ("specedit: %s"):format(status == "cancelled" and "cancelled" or result.message or status)
    elseif status == "cancelled" then
      return "specedit: cancelled, the buffer restored; :SpeceditAccept keeps it"
    end
    return with_hint(("specedit: %s"):format(result.message or "shown as a preview"), "; :SpeceditAccept writes it")
  elseif status == "complete" then
    if #job.hunks == 0 then
      return "specedit: no changes · " .. summary(job.stats)
    elseif job.delivery == "preview" and next(job.marks) ~= nil then
      return "specedit: preview ready · " .. summary(job.stats)
    end
    return "specedit: done · " .. summary(job.stats)
  elseif status == "conflict" then
    local message = ("specedit: %s"):format(result.message or "conflict")
    return with_hint(message, "; :SpeceditAccept writes the rest"), vim.log.levels.WARN
  elseif status == "error" then
    return ("specedit: error: %s"):format(result.message or "unknown"), vim.log.levels.ERROR
  elseif status == "cancelled" and job.delivery == "live" and next(job.written or {}) ~= nil then
    return "specedit: cancelled; :SpeceditReject restores what it wrote"
  end
  return ("specedit: %s"):format(status)
end

local function finish(job, result)
  if job.done then
    return
  end
  job.done, job.result = true, result
  job.stats = result.stats or job.stats
  follow.stop(job)
  preview.pending(job.bufnr, nil)
  local status = result.status
  if result.delivery == "preview" and (job.delivery == "live" or job.offered) and not job.rejected then
    become_preview(job, result.offered)
  end
  local keeps_preview = job.delivery == "preview"
    and (job.offered or status == "complete" or status == "conflict")
    and not job.rejected
  if not keeps_preview and not job.accepted then
    preview.clear(job)
  end
  if job.delivery ~= "preview" or job.rejected then
    jobs.undo_seq[job.bufnr] = nil
  end
  if job.delivery == "live" and not job.rejected and vim.api.nvim_buf_is_valid(job.bufnr) then
    hunks.mark_written(job, result.written, true) -- each can be kept or undone until the next rewrite
  end
  notify(ending_message(job, result))
  fire("SpeceditDone", { bufnr = job.bufnr, result = result })
  vim.cmd.redrawstatus({ bang = true })
  if job.on_done then
    local ok, problem = pcall(job.on_done, result)
    if not ok then
      notify("specedit: on_done failed: " .. tostring(problem), vim.log.levels.ERROR, true)
    end
  end
end

--- A partial result of one of our requests (client.lua routes them here).
function M._on_partial(job, value)
  job.id = job.id or value.jobId
  job.stats = value.stats or job.stats
  local new_hunks = value.hunks or {}
  if value.delivery == "preview" and job.delivery == "live" and not job.done then
    become_preview(job, nil) -- its hunks show once the result says where they are
  end
  if not job.offered then
    vim.list_extend(job.hunks, new_hunks)
  end
  if job.delivery == "preview" and not job.offered and not job.rejected and #new_hunks > 0 then
    preview.add(job, new_hunks)
    hunks.keymaps(job.bufnr, true)
  elseif job.delivery == "live" and value.written ~= nil and vim.api.nvim_buf_is_loaded(job.bufnr) then
    follow.check(job.bufnr)
    hunks.mark_written(job, value.written)
    follow.settle(job.bufnr)
  end
  fire("SpeceditProgress", { bufnr = job.bufnr, job_id = job.id, hunks = new_hunks, stats = value.stats })
  vim.cmd.redrawstatus({ bang = true }) -- a statusline showing status() is stale otherwise
end

--- Where a live rewrite's provisional text now is (client.lua routes the notification here): marked as
--- pending, when the buffer is still at the version the server saw (otherwise the next one comes soon);
--- the window that follows the rewrite goes there.
function M._on_provisional(params)
  local bufnr = vim.uri_to_bufnr(params.uri)
  if not vim.api.nvim_buf_is_loaded(bufnr) then
    return
  end
  local range = params.range ~= vim.NIL and params.range or nil
  local current = range ~= nil and vim.lsp.util.buf_versions[bufnr] == params.version
  preview.pending(bufnr, current and range or nil)
  local job = jobs.for_buffer(bufnr)
  if current and job and not job.done and job.delivery == "live" then
    local first, stop = preview.rows(range)
    follow.to(bufnr, math.max(first, stop - 1))
  end
end

--- The server exited: its running rewrites end (as errors) here, if Neovim did not answer them already.
function M._on_exit(client_id, code, signal)
  for _, job in pairs(jobs.latest) do
    if job.client_id == client_id and not job.done then
      local message = ("the server exited (code %s, signal %s)"):format(code, signal)
      -- Nothing can finish or take back what it was writing (its provisional text included): undone here,
      -- when its edits are still the buffer's last change; else `u` does it.
      local bufnr = job.bufnr
      if job.delivery == "live" and vim.api.nvim_buf_is_loaded(bufnr) and jobs.undo_seq[bufnr] ~= nil then
        if jobs.undo_seq[bufnr] == client.undo_seq(bufnr) then
          vim.api.nvim_buf_call(bufnr, vim.cmd.undo)
          message = message .. "; what it had written is undone"
        else
          message = message .. "; `u` undoes what it had written"
        end
      end
      finish(job, { status = "error", message = message, stats = {} })
    end
  end
end

--- Rewrite the buffer, or a range of it, as instructed.
---@param opts? { instruction?: string, sketch?: string, range?: integer[]|table, delivery?: string,
---  bufnr?: integer, max_new_tokens?: integer, on_done?: fun(result: table) }
---  `range`: { first, last } lines (1-based, inclusive), or an LSP range; none: the whole buffer.
---  `on_done(result)` is called once the rewrite has ended, whatever its `status` (see :help specedit-lua).
---@return specedit.Job? job
function M.rewrite(opts)
  opts = opts or {}
  local bufnr = (opts.bufnr == nil or opts.bufnr == 0) and vim.api.nvim_get_current_buf() or opts.bufnr
  if opts.instruction == nil and opts.sketch == nil then
    vim.ui.input({ prompt = "specedit: " }, function(input)
      if input and input:match("%S") then
        M.rewrite(vim.tbl_extend("force", opts, { instruction = input, bufnr = bufnr }))
      elseif opts.on_done then
        opts.on_done({ status = "cancelled", message = "no instruction given", stats = {} })
      end
    end)
    return nil
  end
  local delivery = opts.delivery or config.options.delivery
  local previous = jobs.for_buffer(bufnr)
  if previous and previous.done then
    preview.clear(previous) -- the server forgets it once the new one overlaps it
    hunks.unmark_written(previous)
    hunks.keymaps(bufnr, false)
    preview.redraw(bufnr)
  end
  local job = jobs.new(bufnr, delivery, opts.instruction, opts.on_done)
  if delivery == "live" then
    follow.start(job)
  end
  if vim.api.nvim_buf_get_name(bufnr) == "" then
    local message = "the buffer has no name: save it first (its name tells the server the language)"
    finish(job, { status = "error", message = message, stats = {} })
    return job
  end
  client.ensure(bufnr, function(lsp_client, problem)
    if not lsp_client then
      return finish(job, { status = "error", message = problem, stats = {} })
    end
    job.client_id = lsp_client.id
    local params = {
      textDocument = { uri = vim.uri_from_bufnr(bufnr), version = vim.lsp.util.buf_versions[bufnr] },
      instruction = opts.instruction,
      sketch = opts.sketch,
      delivery = delivery,
      maxNewTokens = opts.max_new_tokens,
      partialResultToken = job.partial_token,
      workDoneToken = job.progress_token,
    }
    local first, last = 0, vim.api.nvim_buf_line_count(bufnr) - 1
    if type(opts.range) == "table" and opts.range.start then
      params.range = opts.range
      first, last = opts.range.start.line, opts.range["end"].line
    elseif type(opts.range) == "table" and opts.range[1] then
      local from, to = opts.range[1], opts.range[2] or opts.range[1]
      params.range, first, last = line_range(bufnr, from, to, lsp_client.offset_encoding)
    end
    if delivery == "preview" then
      preview.anchor(job, first, last)
    end
    local ok, request_id = client.request(lsp_client, protocol.REWRITE, params, function(err, result)
      if err then
        local cancelled = err.code == -32800 -- RequestCancelled
        result = { status = cancelled and "cancelled" or "error", message = err.message, error = err, stats = {} }
      end
      finish(job, result or { status = "error", message = "no result", stats = {} })
    end, bufnr)
    if not ok then
      return finish(job, { status = "error", message = "the server has stopped", stats = {} })
    end
    job.request_id = request_id
  end)
  return job
end

-- ------------------------------------------------------------------------- accept / reject / cancel

local function target(opts)
  opts = opts or {}
  local bufnr = (opts.bufnr == nil or opts.bufnr == 0) and vim.api.nvim_get_current_buf() or opts.bufnr
  local job = jobs.for_buffer(bufnr)
  local lsp_client = job and job.client_id and vim.lsp.get_client_by_id(job.client_id)
  if not lsp_client then
    notify("specedit: no rewrite in this buffer", vim.log.levels.WARN)
    return nil
  end
  local selector = job.id and { jobId = job.id } or { uri = vim.uri_from_bufnr(bufnr) }
  if opts.hunks then
    selector.hunks = opts.hunks
  end
  return job, lsp_client, selector
end

-- The answer to accept or reject, in one message at most (`done`: what to say when all went well).
local function report(job, what, err, result, on_done, done)
  jobs.undo_seq[job.bufnr] = nil -- whatever the server writes next is another undo step
  preview.redraw(job.bufnr)
  if err then
    notify(("specedit: %s failed: %s"):format(what, err.message), vim.log.levels.ERROR, true)
  elseif result and #(result.skipped or {}) > 0 then
    notify(("specedit: %s: %d hunk(s) left alone (edited since)"):format(what, #result.skipped), vim.log.levels.WARN)
  elseif done then
    notify(done)
  end
  if on_done then
    on_done(result or { error = err })
  end
end

-- Nothing of `job` shown any more: the buffer's hunk keymaps go.
local function settle_keymaps(job)
  if next(job.marks or {}) == nil and next(job.written or {}) == nil then
    hunks.keymaps(job.bufnr, false)
  end
end

--- Write the latest rewrite's pending hunks (a preview, or what a conflict left unwritten); after a live
--- rewrite, keep what it wrote (its marks go).
---@param opts? { bufnr?: integer, hunks?: integer[], on_done?: fun(result: table) }
function M.accept(opts)
  local job, lsp_client, selector = target(opts)
  if not job then
    return
  end
  hunks.unmark_written(job, (opts or {}).hunks)
  preview.redraw(job.bufnr)
  jobs.undo_seq[job.bufnr] = nil -- the accepted hunks: one undo step of their own
  client.execute(lsp_client, job.bufnr, protocol.COMMAND_ACCEPT, { selector }, function(err, result)
    if result then
      job.accepted = true
      local handled = (opts or {}).hunks and vim.list_extend(vim.list_extend({}, result.applied), result.skipped)
      preview.clear(job, handled or nil)
    end
    settle_keymaps(job)
    report(job, "accept", err, result, (opts or {}).on_done)
  end)
end

--- Stop the latest rewrite and restore what it replaced (in live mode, the lines it has written).
---@param opts? { bufnr?: integer, hunks?: integer[], on_done?: fun(result: table) }
function M.reject(opts)
  local job, lsp_client, selector = target(opts)
  if not job then
    return
  end
  job.rejected = not (opts or {}).hunks
  local was_done = job.done -- else the end of the rewrite says "rejected"
  jobs.undo_seq[job.bufnr] = nil
  preview.clear(job, (opts or {}).hunks)
  hunks.unmark_written(job, (opts or {}).hunks)
  settle_keymaps(job)
  preview.redraw(job.bufnr)
  client.execute(lsp_client, job.bufnr, protocol.COMMAND_REJECT, { selector }, function(err, result)
    report(job, "reject", err, result, (opts or {}).on_done, was_done and job.rejected and "specedit: rejected" or nil)
  end)
end

-- `action` (M.accept or M.reject) on the hunk under the cursor of the buffer's latest rewrite.
local function on_hunk_here(action, opts)
  local job = jobs.for_buffer(vim.api.nvim_get_current_buf())
  local hunk = job and hunks.at_cursor(job)
  if not hunk then
    notify("specedit: no hunk under the cursor", vim.log.levels.WARN)
    return
  end
  action({ hunks = { hunk.id }, on_done = (opts or {}).on_done })
end

--- Keep (written) or write (previewed) the hunk under the cursor.
---@param opts? { on_done?: fun(result: table) }
function M.accept_hunk(opts)
  on_hunk_here(M.accept, opts)
end

--- Undo (written) or drop (previewed) the hunk under the cursor.
---@param opts? { on_done?: fun(result: table) }
function M.reject_hunk(opts)
  on_hunk_here(M.reject, opts)
end

--- Move to the next (1) or previous (-1) hunk of the buffer's latest rewrite.
function M.jump(direction)
  local job = jobs.for_buffer(vim.api.nvim_get_current_buf())
  if not (job and hunks.jump(job, direction)) then
    notify("specedit: no more hunks", vim.log.levels.INFO)
  end
end

--- Stop the latest running rewrite (of this buffer, else of any). A live rewrite's buffer is restored by the
--- server, and what it wrote is offered as a preview: :SpeceditAccept writes it, :SpeceditReject drops it.
---@param opts? { bufnr?: integer, on_done?: fun(result: table) }
function M.cancel(opts)
  opts = opts or {}
  local bufnr = (opts.bufnr == nil or opts.bufnr == 0) and vim.api.nvim_get_current_buf() or opts.bufnr
  local job = jobs.for_buffer(bufnr)
  if not job or job.done then
    job = jobs.any_running()
  end
  if not job then
    notify("specedit: nothing to cancel", vim.log.levels.WARN)
    return
  end
  local tries = 0
  -- The server may not have started the job yet (its request still queued): then nothing is cancelled,
  -- and we ask again, a few times, until the job is running or done.
  local function send()
    local lsp_client = job.client_id and vim.lsp.get_client_by_id(job.client_id)
    if job.done or not lsp_client then
      return
    end
    tries = tries + 1
    local selector = job.id and { jobId = job.id } or { uri = vim.uri_from_bufnr(job.bufnr) }
    client.execute(lsp_client, job.bufnr, protocol.COMMAND_CANCEL, { selector }, function(err, result)
      local cancelled = result and result.cancelled or {}
      if not err and #cancelled == 0 and not job.done and tries < 50 then
        vim.defer_fn(send, 100)
      elseif opts.on_done then
        opts.on_done(result or { error = err })
      end
    end)
  end
  if job.client_id then
    send()
  else -- still starting the server: cancel as soon as the request is out
    local timer = assert(vim.uv.new_timer())
    local waited = 0
    timer:start(20, 20, vim.schedule_wrap(function()
      waited = waited + 20
      if job.done or job.client_id or waited > config.options.start_timeout then
        if not timer:is_closing() then
          timer:close()
        end
        send()
      end
    end))
  end
end

--- A short status of the current buffer's running rewrite, for a statusline: else the model loading (or
--- being fetched) before any rewrite, else "".
function M.status(bufnr)
  local job = jobs.for_buffer(bufnr or vim.api.nvim_get_current_buf())
  if not job or job.done then
    local engine = client.engine -- the model fetched or loaded before any rewrite (`loadOnStart`)
    return engine and engine.state == "loading" and "specedit: " .. (engine.message or "loading the model") or ""
  end
  local stats = job.stats or {}
  if stats.phase and stats.phase ~= "writing" and stats.message then
    return "specedit: " .. stats.message -- loading the model · 4 s, reading the file · 1 s, ...
  end
  if not stats.lines_total then
    return "specedit: starting"
  end
  local speed = stats.tokens_per_second or 0
  local rate = speed < 10 and ("%.1f"):format(speed) or ("%.0f"):format(speed)
  return ("specedit: %d/%d lines · %s tok/s"):format(stats.lines_done, stats.lines_total, rate)
end

-- --------------------------------------------------------------------------------------- commands

--- `:SpeceditRewrite[!] [instruction]` (plugin/specedit.lua): with a range, those lines; with !, a preview.
function M._command_rewrite(args)
  local instruction = args.args ~= "" and args.args or nil
  local opts = { instruction = instruction, delivery = args.bang and "preview" or nil }
  if args.range > 0 then
    opts.range = { args.line1, args.line2 }
  end
  M.rewrite(opts)
end

--- `:SpeceditApply[!] [register]`: merge the edit sketch a chat answered (in `register`, default the
--- clipboard `+`, else the unnamed register) into the range or the buffer; a preview, or live with !.
function M._command_apply(args)
  local register = args.args ~= "" and args.args or (vim.fn.has("clipboard") == 1 and "+" or '"')
  local sketch = vim.fn.getreg(register)
  if type(sketch) ~= "string" or vim.trim(sketch) == "" then
    notify(("specedit: register %s holds no edit sketch"):format(register), vim.log.levels.WARN, true)
    return
  end
  local opts = { sketch = sketch, delivery = args.bang and "live" or "preview" }
  if args.range > 0 then
    opts.range = { args.line1, args.line2 }
  end
  return M.rewrite(opts)
end

preview.define_highlights()

return M
