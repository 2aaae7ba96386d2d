-- Cancelling, with a tiny random model that never finishes an answer (only its token budget would end it):
-- the rewrite is still running when it is cancelled, and the buffer stays as it was.
local t = require("runner")
local specedit = require("specedit")
local settings = t.settings()

specedit.setup({ cmd = settings.cmd })

local TIMEOUT = 60000
local BUDGET = 20000 -- tokens: ten seconds or more of the endless model, far more than the test lets it write

local function start(name, delivery)
  local bufnr = t.open(name, settings.original)
  local state = { results = {}, progress = false }
  local group = vim.api.nvim_create_augroup("cancel_spec", { clear = true })
  vim.api.nvim_create_autocmd("LspProgress", {
    group = group,
    callback = function()
      -- Work-done progress reaches Neovim's own handler, so vim.lsp.status() shows it.
      if vim.lsp.status():find("specedit", 1, true) then
        state.progress = true
      end
    end,
  })
  state.job = specedit.rewrite({
    instruction = settings.instruction,
    delivery = delivery,
    max_new_tokens = BUDGET,
    on_done = function(result)
      state.results[#state.results + 1] = result
    end,
  })
  t.wait(TIMEOUT, function()
    return (state.job.stats and state.job.stats.generated_tokens or 0) > 0 or #state.results > 0
  end, "the first partial result")
  t.eq({}, state.results, "results before cancelling (the model must still be writing)")
  t.truthy(specedit.status(bufnr):find("lines", 1, true), "specedit.status(): " .. specedit.status(bufnr))
  state.bufnr, state.group = bufnr, group
  return state
end

local function wait_done(state)
  t.wait(10000, function()
    return #state.results > 0
  end, "the cancelled rewrite to end")
  t.sleep(100)
  vim.api.nvim_del_augroup_by_id(state.group)
  t.eq(1, #state.results, "on_done calls")
  return state.results[1]
end

t.it("live: :SpeceditCancel stops the rewrite, the buffer stays as it was", function()
  local state = start("cancel_live.py", "live")
  vim.cmd("SpeceditCancel")
  local result = wait_done(state)
  t.eq("cancelled", result.status, "status")
  t.truthy((result.stepsAfterCancel or 0) <= 1, "engine steps after cancel: " .. tostring(result.stepsAfterCancel))
  t.truthy(state.progress, "work-done progress in vim.lsp.status()")
  t.eq(settings.original, t.text(state.bufnr), "buffer after cancel")
  -- What it had written is offered as a preview, not left in the buffer.
  t.eq("preview", result.delivery, "delivery")
  local offered = type(result.offered) == "table" and #result.offered.hunks or 0
  local shown = #vim.api.nvim_buf_get_extmarks(state.bufnr, require("specedit.preview").ns, 0, -1, {})
  t.eq(offered > 0, shown > 0, ("a preview shown (%d hunks offered, %d extmarks)"):format(offered, shown))
  t.eq(0, vim.tbl_count(state.job.written or {}), "written hunks marked")
end)

t.it("preview: cancel() stops the rewrite and clears the preview", function()
  local state = start("cancel_preview.py", "preview")
  specedit.cancel()
  local result = wait_done(state)
  t.eq("cancelled", result.status, "status")
  t.eq(settings.original, t.text(state.bufnr), "buffer after cancel")
  local marks = vim.api.nvim_buf_get_extmarks(state.bufnr, require("specedit.preview").ns, 0, -1, {})
  t.eq(0, #marks, "extmarks after cancel")
end)

t.it("a rewrite the model cannot finish ends as an error and writes nothing", function()
  local bufnr = t.open("budget.py", settings.original)
  local result
  specedit.rewrite({
    instruction = settings.instruction,
    delivery = "live",
    max_new_tokens = 8,
    on_done = function(r)
      result = r
    end,
  })
  t.wait(TIMEOUT, function()
    return result ~= nil
  end, "the rewrite to end")
  t.eq("error", result.status, "status")
  t.eq(settings.original, t.text(bufnr), "buffer")
end)

t.it("setup({ filetypes }) attaches the server to those buffers as they open, and only those", function()
  specedit.setup({ cmd = settings.cmd, filetypes = { "python" } })
  local python = t.open("auto.py", settings.original)
  local text = t.open("auto.txt", "plain text\n")
  t.wait(TIMEOUT, function()
    return require("specedit.client").get(python) ~= nil
  end, "the server on the python buffer")
  t.eq(nil, require("specedit.client").get(text), "the server on the text buffer")
  specedit.setup({ cmd = settings.cmd })
end)

t.it("a server that exits mid-rewrite ends the rewrite as an error", function()
  local bufnr = t.open("exit.py", settings.original)
  local results = {}
  local job = specedit.rewrite({
    instruction = settings.instruction,
    delivery = "live",
    max_new_tokens = BUDGET,
    on_done = function(result)
      results[#results + 1] = result
    end,
  })
  t.wait(TIMEOUT, function()
    return (job.stats and job.stats.generated_tokens or 0) > 0
  end, "the first partial result")
  vim.lsp.stop_client(job.client_id, true)
  t.wait(10000, function()
    return #results > 0
  end, "on_done")
  t.sleep(200)
  t.eq(1, #results, "on_done calls")
  t.eq("error", results[1].status, "status: " .. vim.inspect(results[1]))
  t.eq(settings.original, t.text(bufnr), "buffer")
end)
