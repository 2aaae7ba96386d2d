--- A tiny test runner for the headless specs: `it(name, fn)` cases, asserts, bounded waits, and an exit
--- code (0: every case passed).
---
---   nvim --headless -u minimal_init.lua -c "lua require('runner').main('x_spec.lua')"
---
--- The cases run in a coroutine that gives the main loop back while it waits (`wait`, `sleep`), so server
--- messages are handled as in an interactive session. That matters for undo: changes made inside one
--- blocking command (`vim.wait` in a `-c` command) all land in one undo block, whereas changes made from the
--- main loop get one each unless joined, which is what `:undojoin` in the plugin is for.
local M = { cases = {} }

local TOTAL_TIMEOUT = 140000 -- ms for the whole spec file; tests/test_nvim.py kills nvim a little later

local function write(text)
  io.stdout:write(text .. "\n")
  io.stdout:flush()
end

--- A case.
function M.it(name, fn)
  M.cases[#M.cases + 1] = { name = name, fn = fn }
end

function M.eq(expected, actual, what)
  if not vim.deep_equal(expected, actual) then
    local message = (what or "values differ") .. ":\n  expected " .. vim.inspect(expected)
    error(message .. "\n  got      " .. vim.inspect(actual), 2)
  end
end

function M.truthy(value, what)
  if not value then
    error(what or "expected a true value", 2)
  end
  return value
end

--- Give the main loop back for `ms` milliseconds.
function M.sleep(ms)
  local co = assert(coroutine.running(), "sleep outside a case")
  vim.defer_fn(function()
    assert(coroutine.resume(co))
  end, ms)
  coroutine.yield()
end

--- Wait (the main loop running meanwhile) until `predicate()` holds; an error after `ms` milliseconds.
function M.wait(ms, predicate, what)
  local deadline = vim.uv.now() + ms
  while not predicate() do
    if vim.uv.now() > deadline then
      error(("timed out after %d ms waiting for %s"):format(ms, what or "a condition"), 2)
    end
    M.sleep(10)
  end
end

--- The test settings written by tests/test_nvim.py (JSON): server command, work folder, expected texts.
function M.settings()
  if not M._settings then
    local file = assert(io.open(assert(os.getenv("SPECEDIT_NVIM_TEST"), "SPECEDIT_NVIM_TEST unset"), "r"))
    M._settings = vim.json.decode(file:read("*a"))
    file:close()
  end
  return M._settings
end

--- The buffer's text as the server sees it: lines joined with the file format's line ending, and one at
--- the end when 'eol'.
function M.text(bufnr)
  bufnr = bufnr or 0
  local ending = ({ dos = "\r\n", mac = "\r" })[vim.bo[bufnr].fileformat] or "\n"
  local text = table.concat(vim.api.nvim_buf_get_lines(bufnr, 0, -1, true), ending)
  return vim.bo[bufnr].eol and text .. ending or text
end

--- Open a new file `name` in the work folder holding `text`, in a buffer of its own.
function M.open(name, text)
  local path = M.settings().workdir .. "/" .. name
  local file = assert(io.open(path, "wb"))
  file:write(text)
  file:close()
  vim.cmd.edit(vim.fn.fnameescape(path))
  return vim.api.nvim_get_current_buf()
end

local function quit(code)
  vim.lsp.stop_client(vim.lsp.get_clients(), true)
  vim.wait(3000, function()
    return #vim.lsp.get_clients() == 0
  end, 20)
  if code ~= 0 then
    vim.cmd("cquit " .. code)
  end
  vim.cmd("qall!")
end

local function run_cases(started)
  local failed, ran = 0, 0
  for _, case in ipairs(M.cases) do
    ran = ran + 1
    local t0 = vim.uv.hrtime()
    local passed, err = xpcall(case.fn, debug.traceback)
    local ms = (vim.uv.hrtime() - t0) / 1e6
    if passed then
      write(("ok   %s (%.0f ms)"):format(case.name, ms))
    else
      failed = failed + 1
      write(("FAIL %s (%.0f ms)\n%s"):format(case.name, ms, err))
    end
  end
  write(("%d passed, %d failed in %.1f s"):format(ran - failed, failed, (vim.uv.hrtime() - started) / 1e9))
  return failed
end

function M.main(spec)
  local started = vim.uv.hrtime()
  local ok, problem = xpcall(dofile, debug.traceback, spec)
  if not ok then
    write("ERROR loading " .. spec .. ": " .. problem)
    return quit(3)
  end
  vim.defer_fn(function()
    write(("TIMEOUT: %s still running after %d ms"):format(spec, TOTAL_TIMEOUT))
    quit(2)
  end, TOTAL_TIMEOUT)
  -- Start from the main loop (not inside this -c command), and return to it.
  vim.schedule(function()
    coroutine.wrap(function()
      local failed = run_cases(started)
      vim.schedule(function()
        quit(failed > 0 and 1 or 0)
      end)
    end)()
  end)
end

return M
