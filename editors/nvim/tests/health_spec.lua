-- :checkhealth specedit, and what a rewrite does when the server cannot start.
local t = require("runner")
local specedit = require("specedit")
local settings = t.settings()

local function health_report()
  vim.cmd("checkhealth specedit")
  local text = table.concat(vim.api.nvim_buf_get_lines(0, 0, -1, false), "\n")
  vim.cmd("bwipeout!")
  return text
end

t.it("reports a missing server executable", function()
  specedit.setup({ cmd = { settings.missing, "lsp" } })
  local report = health_report()
  t.truthy(report:find("server executable not found: " .. settings.missing, 1, true), report)
  t.truthy(report:find("ERROR", 1, true), report)
end)

t.it("a rewrite without a server ends as an error, and the buffer stays", function()
  specedit.setup({ cmd = { settings.missing, "lsp" } })
  local bufnr = t.open("missing.py", settings.original)
  local result
  specedit.rewrite({
    instruction = "anything",
    on_done = function(r)
      result = r
    end,
  })
  t.wait(5000, function()
    return result ~= nil
  end, "on_done")
  t.eq("error", result.status, "status")
  t.truthy(result.message:find("not executable", 1, true), result.message)
  t.eq(settings.original, t.text(bufnr), "buffer")
end)

t.it("reports a working server", function()
  specedit.setup({ cmd = settings.cmd })
  local report = health_report()
  t.truthy(report:find("OK server:", 1, true), report)
  t.truthy(report:find("OK model: /", 1, true), report) -- the test's model folder
  t.truthy(report:find("engine: in the server's own process", 1, true), report)
  t.truthy(not report:find("ERROR", 1, true), report)
end)

t.it("reports the model and the engine daemon of a default command", function()
  -- `python -m specedit.lsp` with no --model or --engine: the default model, the shared daemon.
  specedit.setup({ cmd = { settings.cmd[1], "-m", "specedit.lsp" } })
  local report = health_report()
  t.truthy(report:find("model: qwen2.5-coder-0.5b-instruct", 1, true), report)
  t.truthy(report:find("engine daemon: ", 1, true), report)
  specedit.setup({ cmd = settings.cmd })
end)
