-- The plugin on the runtimepath and nothing else: setup() is never called. The default command
-- `specedit lsp` is found on the PATH, where tests/test_nvim.py puts one that starts the test's server.
local t = require("runner")
local settings = t.settings()

local TIMEOUT = 60000 -- the first rewrite starts the server and loads the model

-- Run an Ex command; an error fails the case.
local function run(command)
  local ok, problem = pcall(vim.cmd, command)
  t.truthy(ok, (":%s failed: %s"):format(command, tostring(problem)))
end

-- Run a command that starts a rewrite; its result.
local function rewrite(command)
  local result
  vim.api.nvim_create_autocmd("User", {
    pattern = "SpeceditDone",
    once = true,
    callback = function(args)
      result = args.data.result
    end,
  })
  run(command)
  t.wait(TIMEOUT, function()
    return result ~= nil
  end, "SpeceditDone after :" .. command)
  return result
end

t.it("every command works without setup()", function()
  t.eq(nil, package.loaded["specedit.config"], "the plugin's modules before the first command")

  local bufnr = t.open("apply.py", settings.sketch_original)
  vim.fn.setreg("l", settings.lines_sketch)
  local result = rewrite("SpeceditApply l")
  t.eq("complete", result.status, "status: " .. tostring(result.message))
  run("SpeceditNextHunk")
  run("SpeceditPrevHunk")
  vim.api.nvim_win_set_cursor(0, { 2, 0 }) -- the changed line
  run("SpeceditAcceptHunk")
  t.wait(10000, function()
    return t.text(bufnr) == settings.lines_merged
  end, "the hunk written")

  bufnr = t.open("rewrite.py", settings.original)
  t.eq("complete", rewrite("SpeceditRewrite " .. settings.instruction).status, "status")
  t.eq(settings.expected, t.text(bufnr), "buffer after a live rewrite")
  vim.api.nvim_win_set_cursor(0, { 1, 0 })
  run("SpeceditAcceptHunk")
  run("SpeceditRejectHunk")
  run("SpeceditReject")
  run("SpeceditAccept")
  run("SpeceditCancel")
  t.sleep(300)
end)

t.it(":help specedit opens the plugin's help (doc/tags is shipped)", function()
  run("help specedit")
  t.eq("specedit.txt", vim.fn.expand("%:t"), "the help file")
  run("help :SpeceditApply")
  t.eq("specedit.txt", vim.fn.expand("%:t"), "the help file")
  vim.cmd.helpclose()
end)
