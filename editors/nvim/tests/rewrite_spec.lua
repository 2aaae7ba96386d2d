-- Rewrites through the real server and a tiny model that memorised its answers (tests/conftest.py): each
-- delivery mode ends with the buffer equal to what `specedit rewrite` wrote for the same input.
local t = require("runner")
local specedit = require("specedit")
local settings = t.settings()

specedit.setup({ cmd = settings.cmd, delivery = "live" })

local TIMEOUT = 60000 -- the first rewrite starts the server and loads the model

--- Run a rewrite and wait for its end; returns the result (on_done must be called exactly once).
local function rewrite(opts)
  local results = {}
  opts.on_done = function(result)
    results[#results + 1] = result
  end
  local job = specedit.rewrite(opts)
  t.wait(TIMEOUT, function()
    return #results > 0
  end, "the rewrite to end")
  t.sleep(100) -- a second on_done would come now
  t.eq(1, #results, "on_done calls")
  return results[1], job
end

--- Run specedit.accept or specedit.reject on the current buffer and wait for what it did.
local function edit_and_wait(action)
  local result
  specedit[action]({
    on_done = function(edit)
      result = edit
    end,
  })
  t.wait(10000, function()
    return result ~= nil
  end, action)
  return result
end

--- Listen for the next SpeceditDone event (a rewrite started by a command); the returned function waits
--- for it and gives its result.
local function next_done()
  local result
  vim.api.nvim_create_autocmd("User", {
    pattern = "SpeceditDone",
    once = true,
    callback = function(args)
      result = args.data.result
    end,
  })
  return function()
    t.wait(TIMEOUT, function()
      return result ~= nil
    end, "SpeceditDone")
    return result
  end
end

local function preview_lines(bufnr)
  local lines = {}
  local ns = require("specedit.preview").ns
  for _, mark in ipairs(vim.api.nvim_buf_get_extmarks(bufnr, ns, 0, -1, { details = true })) do
    for _, virt_line in ipairs(mark[4].virt_lines or {}) do
      lines[#lines + 1] = { mark[2], virt_line[1][1] }
    end
  end
  return lines
end

local function marks(bufnr)
  return #vim.api.nvim_buf_get_extmarks(bufnr, require("specedit.preview").ns, 0, -1, {})
end

t.it("live: the buffer ends as `specedit rewrite` wrote it, in one undo step", function()
  local bufnr = t.open("live.py", settings.original)
  -- Partial results go to the plugin, work-done progress to Neovim's handler (vim.lsp.status()).
  local default_progress, tokens = vim.lsp.handlers["$/progress"], {}
  vim.lsp.handlers["$/progress"] = function(err, params, ctx, config)
    tokens[params.token] = true
    return default_progress(err, params, ctx, config)
  end
  -- The text being written shows, marked pending, before its hunk settles.
  local on_provisional, pending = specedit._on_provisional, {}
  specedit._on_provisional = function(params)
    on_provisional(params)
    local first, last = require("specedit.preview").pending_lines(bufnr)
    if first then
      pending[#pending + 1] = table.concat(vim.api.nvim_buf_get_lines(bufnr, first, last + 1, true), "\n")
    end
  end
  -- The statusline text follows the rewrite: every status() seen while it runs says what it does.
  local seen = {}
  local group = vim.api.nvim_create_augroup("status_spec", { clear = true })
  vim.api.nvim_create_autocmd("User", {
    group = group,
    pattern = "SpeceditProgress",
    callback = function()
      seen[#seen + 1] = specedit.status(bufnr)
    end,
  })
  local result, job = rewrite({ instruction = settings.instruction, delivery = "live" })
  vim.api.nvim_del_augroup_by_id(group)
  specedit._on_provisional = on_provisional
  t.truthy(#seen > 0, "status() while running")
  for _, text in ipairs(seen) do
    local known = text:match("^specedit: %d+/%d+ lines · [%d.]+ tok/s$")
      or text:match("^specedit: loading the model · %d+ s$")
      or text:match("^specedit: reading the file · %d+ s$")
      or text:match("^specedit: starting · %d+ s$")
    t.truthy(known, "status(): " .. text)
  end
  t.eq("", specedit.status(bufnr), "status() after the end")
  vim.lsp.handlers["$/progress"] = default_progress
  t.truthy(#pending > 0, "provisional text marked pending")
  for _, text in ipairs(pending) do
    t.truthy(vim.startswith(settings.expected, text), "pending text is the rewrite's beginning: " .. text)
  end
  t.eq(nil, require("specedit.preview").pending_lines(bufnr), "a pending mark after the end")
  t.truthy(tokens[job.progress_token], "work-done progress reached Neovim's handler")
  t.truthy(not tokens[job.partial_token], "partial results reached Neovim's handler")
  t.truthy(#job.hunks > 0, "hunks in partial results")
  t.eq("complete", result.status, "status")
  t.eq(settings.expected, t.text(bufnr), "buffer after a live rewrite")
  t.truthy(result.stats and result.stats.generated_tokens > 0, "the final stats")
  t.truthy(next(job.written) ~= nil, "the written hunks marked")
  vim.cmd.undo()
  t.eq(settings.original, t.text(bufnr), "buffer after one undo")
  t.wait(5000, function()
    return next(job.written) == nil
  end, "the undone rewrite's hunks unmarked")
  t.eq(0, marks(bufnr), "extmarks left after undo")
  vim.cmd.redo()
  t.eq(settings.expected, t.text(bufnr), "buffer after redo")
end)

t.it("preview: virtual lines only, then :SpeceditAccept writes them", function()
  local bufnr = t.open("preview.py", settings.original)
  local result = rewrite({ instruction = settings.instruction, delivery = "preview" })
  t.eq("complete", result.status, "status")
  t.eq(settings.original, t.text(bufnr), "buffer while previewing")
  t.eq({ { 0, "def plus(a, b):" } }, preview_lines(bufnr), "virtual lines (row, text)")
  local accepted = edit_and_wait("accept")
  t.truthy(#accepted.applied > 0, "hunks applied: " .. vim.inspect(accepted))
  t.eq(settings.expected, t.text(bufnr), "buffer after accept")
  t.eq(0, marks(bufnr), "extmarks left after accept")
  vim.cmd.undo()
  t.eq(settings.original, t.text(bufnr), "buffer after one undo")
end)

t.it("a rewrite that changes nothing says so", function()
  local told = {}
  local notify = vim.notify
  vim.notify = function(message)
    told[#told + 1] = message
  end
  for _, delivery in ipairs({ "live", "preview", "final" }) do
    local bufnr = t.open("unchanged_" .. delivery .. ".py", settings.noop_original)
    local result = rewrite({ instruction = settings.noop_instruction, delivery = delivery })
    t.eq("complete", result.status, delivery .. ": status")
    t.eq(settings.noop_original, t.text(bufnr), delivery .. ": buffer")
    t.truthy(told[#told]:find("^specedit: no changes"), delivery .. ": told " .. vim.inspect(told[#told]))
  end
  t.open("changed.py", settings.original)
  t.eq("complete", rewrite({ instruction = settings.instruction, delivery = "live" }).status, "status")
  t.truthy(told[#told]:find("^specedit: done"), "a rewrite that changed the buffer: " .. vim.inspect(told[#told]))
  vim.notify = notify
end)

t.it("preview: :SpeceditReject leaves the buffer as it was", function()
  local bufnr = t.open("reject.py", settings.original)
  local result = rewrite({ instruction = settings.instruction, delivery = "preview" })
  t.eq("complete", result.status, "status")
  t.truthy(marks(bufnr) > 0, "a preview is shown")
  vim.cmd("SpeceditReject")
  t.wait(10000, function()
    return marks(bufnr) == 0
  end, "the preview to go")
  t.sleep(300)
  t.eq(settings.original, t.text(bufnr), "buffer after reject")
end)

local function answer_of(action, opts)
  local answer
  opts = vim.tbl_extend("force", opts or {}, {
    on_done = function(result)
      answer = result
    end,
  })
  action(opts)
  t.wait(3000, function()
    return answer ~= nil
  end, "the server's answer")
  return answer
end

t.it("preview: reject answers", function()
  local bufnr = t.open("reject_answer.py", settings.original)
  t.eq("complete", rewrite({ instruction = settings.instruction, delivery = "preview" }).status, "status")
  local answer = answer_of(specedit.reject)
  t.eq({}, answer.applied, "restored hunks (none were written)")
  t.eq(settings.original, t.text(bufnr), "buffer after reject")
end)

t.it("preview: accept leaves alone the lines the user edited meanwhile", function()
  local bufnr = t.open("accept_edited.py", settings.original)
  t.eq("complete", rewrite({ instruction = settings.instruction, delivery = "preview" }).status, "status")
  vim.api.nvim_buf_set_lines(bufnr, 0, 1, true, { "def add(a, b):  # mine" })
  t.sleep(200) -- past the didChange debounce
  local answer = answer_of(specedit.accept)
  t.eq({}, answer.applied, "hunks written")
  t.eq(1, #answer.skipped, "hunks left alone")
  t.eq("def add(a, b):  # mine\n    return a + b\n", t.text(bufnr), "buffer: the user's line stays")
end)

t.it("final (:1,$SpeceditRewrite, instruction asked for): one edit at the end", function()
  specedit.setup({ cmd = settings.cmd, delivery = "final" })
  local bufnr = t.open("final.py", settings.original)
  local done = next_done()
  local ticks = {}
  vim.api.nvim_buf_attach(bufnr, false, {
    on_lines = function()
      ticks[#ticks + 1] = vim.b[bufnr].changedtick
    end,
  })
  -- A range, and no instruction: it is asked for.
  local input = vim.ui.input
  vim.ui.input = function(_, on_confirm)
    on_confirm(settings.instruction)
  end
  vim.cmd("1,$SpeceditRewrite")
  vim.ui.input = input
  local result = done()
  specedit.setup({ cmd = settings.cmd, delivery = "live" })
  t.eq("complete", result.status, "status")
  t.eq(settings.expected, t.text(bufnr), "buffer after a final rewrite")
  t.eq(1, #ticks, "buffer changes (one edit)")
end)

t.it("live, then :SpeceditReject restores the original", function()
  local bufnr = t.open("live_reject.py", settings.original)
  local result = rewrite({ instruction = settings.instruction, delivery = "live" })
  t.eq("complete", result.status, "status")
  t.eq(settings.expected, t.text(bufnr), "buffer after the live rewrite")
  edit_and_wait("reject")
  t.eq(settings.original, t.text(bufnr), "buffer after reject")
end)

t.it("live: the written hunks stay marked; the one under the cursor is undone with its keymap", function()
  local bufnr = t.open("live_hunk.py", settings.original)
  local result, job = rewrite({ instruction = settings.instruction, delivery = "live" })
  t.eq("complete", result.status, "status")
  local ids = vim.tbl_keys(job.written or {})
  t.truthy(#ids > 0, "written hunks marked")
  local function mapped(keys)
    return vim.fn.maparg(keys, "n", false, true).buffer == 1
  end
  t.truthy(mapped("]h") and mapped("<leader>hr"), "the hunk keymaps of the buffer")
  vim.api.nvim_win_set_cursor(0, { vim.api.nvim_buf_line_count(bufnr), 0 })
  vim.cmd("SpeceditPrevHunk")
  local hunk = require("specedit.hunks").at_cursor(job)
  t.truthy(hunk and hunk.written, "a written hunk under the cursor after [h")
  local undone
  specedit.reject_hunk({
    on_done = function(edit)
      undone = edit
    end,
  })
  t.wait(10000, function()
    return undone ~= nil
  end, "reject_hunk")
  t.eq({ hunk.id }, undone.applied, "the hunk restored")
  t.eq(settings.original, t.text(bufnr), "buffer after undoing its one hunk")
  t.truthy(not mapped("]h"), "the keymaps go with the last hunk")
end)

t.it("live: what the user types elsewhere during the rewrite stays", function()
  local bufnr = t.open("typing.py", settings.region_original)
  local header_typed = false
  local group = vim.api.nvim_create_augroup("typing_spec", { clear = true })
  vim.api.nvim_create_autocmd("User", {
    group = group,
    pattern = "SpeceditProgress",
    callback = function()
      if not header_typed then -- a line above the region, while the model writes
        header_typed = true
        vim.api.nvim_buf_set_lines(bufnr, 0, 0, true, { "# typed above" })
      end
    end,
  })
  local results = {}
  specedit.rewrite({
    instruction = settings.instruction,
    delivery = "live",
    range = { 1, settings.region_lines },
    on_done = function(result)
      results[#results + 1] = result
    end,
  })
  -- Right after the request, before any answer: a change below the region.
  local last = vim.api.nvim_buf_line_count(bufnr)
  vim.api.nvim_buf_set_lines(bufnr, last - 1, last, true, { settings.typed_line })
  t.wait(TIMEOUT, function()
    return #results > 0
  end, "the rewrite to end")
  vim.api.nvim_del_augroup_by_id(group)
  t.eq("complete", results[1].status, "status")
  io.stdout:write(("     (a line typed above the region during the rewrite: %s)\n"):format(header_typed))
  local expected = settings.region_expected_typed
  if header_typed then
    expected = "# typed above\n" .. expected
  end
  t.eq(expected, t.text(bufnr), "buffer: the rewrite plus the user's lines")
end)

t.it("live: CRLF and non-ASCII text end as `specedit rewrite` wrote them", function()
  local bufnr = t.open("crlf.py", settings.crlf_original)
  t.eq("dos", vim.bo[bufnr].fileformat, "fileformat")
  local result = rewrite({ instruction = settings.crlf_instruction, delivery = "live" })
  t.eq("complete", result.status, "status")
  t.eq(settings.crlf_expected, t.text(bufnr), "buffer after a live rewrite")
end)

t.it("consecutive server edits are one undo step; the user's change in between is not joined", function()
  local bufnr = t.open("undo.py", "a\nb\nc\nd\n")
  local lsp_client
  require("specedit.client").ensure(bufnr, function(c)
    lsp_client = c
  end)
  t.wait(TIMEOUT, function()
    return lsp_client ~= nil
  end, "the server")
  local apply = require("specedit.client").handlers["workspace/applyEdit"]
  local function server_edit(line, text)
    local version = vim.lsp.util.buf_versions[bufnr]
    local range = { start = { line = line, character = 0 }, ["end"] = { line = line + 1, character = 0 } }
    local answer = apply(nil, {
      edit = {
        documentChanges = {
          {
            textDocument = { uri = vim.uri_from_bufnr(bufnr), version = version },
            edits = { { range = range, newText = text } },
          },
        },
      },
    }, { client_id = lsp_client.id, method = "workspace/applyEdit" })
    t.eq({ applied = true }, answer, "applyEdit answer")
    t.sleep(30) -- back to the main loop between edits, as between server messages
  end
  require("specedit.jobs").undo_seq[bufnr] = nil -- as when a rewrite starts
  server_edit(0, "A\n")
  server_edit(1, "B\n")
  server_edit(2, "C\n")
  t.eq("A\nB\nC\nd\n", t.text(bufnr), "after three edits")
  vim.cmd.undo()
  t.eq("a\nb\nc\nd\n", t.text(bufnr), "one undo undoes all three")
  vim.cmd.redo()
  vim.api.nvim_buf_set_lines(bufnr, 3, 4, true, { "user" }) -- the user's change, between two server edits
  t.sleep(30)
  server_edit(0, "AA\n")
  vim.cmd.undo()
  t.eq("A\nB\nC\nuser\n", t.text(bufnr), "undo after the user's change: only the server's edit")
  vim.cmd.undo()
  t.eq("A\nB\nC\nd\n", t.text(bufnr), "the next undo: the user's change")
end)

t.it(":SpeceditApply previews a sketch its lines merge; accepting writes the merge", function()
  specedit.setup({ cmd = settings.cmd, delivery = "preview" })
  local bufnr = t.open("lines_sketch.py", settings.sketch_original)
  vim.fn.setreg("l", settings.lines_sketch)
  local done = next_done()
  vim.cmd("SpeceditApply l")
  local result = done()
  t.eq("complete", result.status, "status")
  t.eq("lines", result.stats.merge, "merged by its lines")
  t.eq(settings.sketch_original, t.text(bufnr), "buffer while previewing")
  edit_and_wait("accept")
  t.eq(settings.lines_merged, t.text(bufnr), "buffer after accept")
end)

t.it(":SpeceditApply! merges the sketch in a register; an answer that is not a merge is never applied", function()
  specedit.setup({ cmd = settings.cmd, delivery = "live" })
  local bufnr = t.open("sketch.py", settings.sketch_original)
  vim.fn.setreg("s", settings.echoed_sketch)
  local done = next_done()
  vim.cmd("SpeceditApply! s") -- live: whatever it wrote is taken back
  local result = done()
  t.eq("error", result.status, "status")
  t.truthy(result.message:find("not a merge of the edit sketch", 1, true), "message: " .. tostring(result.message))
  t.sleep(300)
  t.eq(settings.sketch_original, t.text(bufnr), "buffer after an echoed sketch")
end)

t.it("per-hunk actions on hunks at both ends of the buffer: each one done, none said to be left alone", function()
  local original = "def a():\n    return 1\n\n\ndef b():\n    return 2\n\n\ndef c():\n    return 3\n"
  local sketch = "def a():\n    return 10\n\n# ... existing code ...\n\ndef c():\n    return 30\n"
  local told = {}
  local notify = vim.notify
  vim.notify = function(message)
    told[#told + 1] = message
  end
  local function on_hunk(action, line)
    vim.api.nvim_win_set_cursor(0, { line, 0 })
    local answer
    specedit[action]({
      on_done = function(result)
        answer = result
      end,
    })
    t.wait(10000, function()
      return answer ~= nil
    end, action)
    return answer
  end
  for _, bang in ipairs({ "", "!" }) do
    specedit.setup({ cmd = settings.cmd, delivery = "live" })
    local bufnr = t.open(("both_ends%s.py"):format(bang == "" and "" or "_live"), original)
    vim.fn.setreg("s", sketch)
    local done = next_done()
    vim.cmd("SpeceditApply" .. bang .. " s")
    t.eq("complete", done().status, "status")
    local action = bang == "" and "accept_hunk" or "reject_hunk" -- write a preview's, undo a live one's
    local want = bang == "" and "def a():\n    return 10\n\n\ndef b():\n    return 2\n\n\ndef c():\n    return 30\n"
      or original
    t.eq({ 0 }, on_hunk(action, 2).applied, action .. " on the first line's hunk")
    t.eq({ 1 }, on_hunk(action, 10).applied, action .. " on the last line's hunk")
    t.eq(want, t.text(bufnr), "buffer after " .. action)
    t.eq(0, marks(bufnr), "extmarks left")
  end
  vim.notify = notify
  for _, message in ipairs(told) do
    t.truthy(not message:find("left alone", 1, true), "told: " .. message)
  end
end)

t.it("live: the old lines of the written hunk show as deleted virtual lines, above the first line too", function()
  local bufnr = t.open("live_diff.py", settings.original)
  local result, job = rewrite({ instruction = settings.instruction, delivery = "live" })
  t.eq("complete", result.status, "status")
  local old = {}
  local ns = require("specedit.preview").ns
  for _, mark in ipairs(vim.api.nvim_buf_get_extmarks(bufnr, ns, 0, -1, { details = true })) do
    for _, line in ipairs(mark[4].virt_lines or {}) do
      old[#old + 1] = { mark[2], mark[4].virt_lines_above, line[1][1] }
    end
  end
  t.eq({ { 0, true, "def add(a, b):" } }, old, "the deleted line (row, above, text)")
  t.eq(1, vim.fn.winsaveview().topfill, "the window scrolled to show it above the first line")
  t.truthy(next(job.written) ~= nil, "the written hunk marked")
end)
