-- What a live rewrite looks like, with a scripted server (fake_server.lua) saying what the real one says:
-- the written hunks as a diff, a rewrite turned into a preview (the guard, a cancel), the window that
-- follows the writing, previews at the buffer's edges, one-line messages. The screen is read back with
-- screenstring() at 80 columns.
local t = require("runner")
local fake = require("fake_server")
local specedit = require("specedit")

local server = fake.new()
specedit.setup({ cmd = server.cmd, delivery = "live" })
vim.o.columns, vim.o.lines = 80, 24
vim.o.signcolumn = "no" -- the screen's rows start with the text

local ORIGINAL = { "def add(a, b):", "    return a + b", "", "", "print(add(1, 2))" }
local ns = require("specedit.preview").ns

-- Every message echoed (what Neovim's own vim.notify shows), through Neovim's own vim.notify.
local echoed = {}
local echo = vim.api.nvim_echo
vim.api.nvim_echo = function(chunks, history, opts)
  local text = ""
  for _, chunk in ipairs(chunks) do
    text = text .. chunk[1]
  end
  echoed[#echoed + 1] = text
  return echo(chunks, history, opts)
end

-- The messages echoed since `from` (an index into `echoed`), each checked to fit the command line.
local function messages_since(from)
  local found = {}
  for i = from + 1, #echoed do
    local width = vim.fn.strdisplaywidth(echoed[i])
    t.truthy(width <= vim.v.echospace, ("a message wider than the command line (%d > %d): %s"):format(
      width,
      vim.v.echospace,
      echoed[i]
    ))
    found[#found + 1] = echoed[i]
  end
  return found
end

local function screen()
  vim.cmd.redraw()
  local rows = {}
  for row = 1, vim.o.lines - 2 do
    local text = ""
    for col = 1, 40 do
      text = text .. vim.fn.screenstring(row, col)
    end
    rows[#rows + 1] = vim.trim((text:gsub("%s%s+specedit:.*$", ""))) -- without the hints
  end
  return rows
end

local function full_screen()
  vim.cmd("redraw!")
  return screen()
end

local function lines(bufnr)
  return vim.api.nvim_buf_get_lines(bufnr, 0, -1, true)
end

-- The virtual lines of the buffer's marks: { row, above, text, highlight }.
local function virtual(bufnr)
  local found = {}
  for _, mark in ipairs(vim.api.nvim_buf_get_extmarks(bufnr, ns, 0, -1, { details = true })) do
    for _, line in ipairs(mark[4].virt_lines or {}) do
      found[#found + 1] = { mark[2], mark[4].virt_lines_above or false, line[1][1], line[1][2] }
    end
  end
  return found
end

local function start(name, buffer_lines, opts)
  local bufnr = t.open(name, table.concat(buffer_lines, "\n") .. "\n")
  local state = { bufnr = bufnr }
  state.job = specedit.rewrite(vim.tbl_extend("force", {
    instruction = "Rename add to plus.",
    delivery = "live",
    on_done = function(result)
      state.result = result
    end,
  }, opts or {}))
  state.request = server:wait_rewrite()
  return state
end

local function wait_result(state)
  t.wait(5000, function()
    return state.result ~= nil
  end, "the result")
  return state.result
end

local function hunk(id, range, old, new)
  return { id = id, range = range, oldText = old, newText = new }
end

local function version(bufnr)
  return vim.lsp.util.buf_versions[bufnr]
end

-- Lines written like the real server writes them: hunk 0 renames the function, hunk 1 deletes a blank
-- line, hunk 2 renames the call.
local function write_all(state)
  local bufnr = state.bufnr
  t.eq({ applied = true }, server:apply(bufnr, { { 0, 1, { "def plus(a, b):" } } }), "applyEdit")
  t.eq({ applied = true }, server:apply(bufnr, { { 2, 3, {} }, { 4, 5, { "print(plus(1, 2))" } } }), "applyEdit")
  return {
    version = version(bufnr),
    hunks = {
      hunk(0, fake.lines(0, 1), "def add(a, b):\n", "def plus(a, b):\n"),
      hunk(1, fake.lines(2, 2), "\n", ""),
      hunk(2, fake.lines(3, 4), "print(add(1, 2))\n", "print(plus(1, 2))\n"),
    },
  }
end

t.it("live: the old lines of each written hunk show as deleted, above its new ones, until kept or undone", function()
  local state = start("diff.py", ORIGINAL)
  local bufnr = state.bufnr
  local written = write_all(state)
  server:partial(state.request, { delivery = "live", hunks = written.hunks, written = written })
  t.eq({ "def plus(a, b):", "    return a + b", "", "print(plus(1, 2))" }, lines(bufnr), "buffer")
  t.eq({
    { 0, true, "def add(a, b):", "SpeceditRemoved" },
    { 2, true, "", "SpeceditRemoved" },
    { 3, true, "print(add(1, 2))", "SpeceditRemoved" },
  }, virtual(bufnr), "the old lines, as virtual lines above the new ones")
  -- Above the first line: shown only with the window scrolled into them ('topfill').
  local rows = screen()
  t.eq({ "def add(a, b):", "def plus(a, b):", "return a + b", "", "" }, vim.list_slice(rows, 1, 5), "screen")
  t.eq("print(add(1, 2))", rows[6], "screen")

  server:reply(state.request, { status = "complete", delivery = "live", written = written })
  t.eq("complete", wait_result(state).status, "status")
  t.eq(3, vim.tbl_count(state.job.written), "written hunks marked after the end")
  t.eq(3, #virtual(bufnr), "virtual lines after the end")

  -- Keep hunk 0, undo hunk 2: each one's deleted lines go, and the screen is as a full redraw draws it.
  server.on_command = function(command, arguments)
    local selector = arguments[1]
    if command == "specedit.reject" then
      server:apply(bufnr, { { 3, 4, { "print(add(1, 2))" } } })
    end
    return { jobId = "job-1", applied = command == "specedit.reject" and selector.hunks or {}, skipped = {} }
  end
  local from = #echoed
  local kept, undone
  vim.api.nvim_win_set_cursor(0, { 1, 0 })
  specedit.accept_hunk({
    on_done = function(result)
      kept = result
    end,
  })
  t.wait(3000, function()
    return kept ~= nil
  end, "accept_hunk")
  t.eq({ 0 }, server.commands[#server.commands].arguments[1].hunks, "the hunk kept")
  t.eq(
    { { 2, true, "", "SpeceditRemoved" }, { 3, true, "print(add(1, 2))", "SpeceditRemoved" } },
    virtual(bufnr),
    "after keeping hunk 0"
  )
  local drawn = screen()
  t.eq(full_screen(), drawn, "the screen after keeping a hunk")
  vim.api.nvim_win_set_cursor(0, { 4, 0 })
  specedit.reject_hunk({
    on_done = function(result)
      undone = result
    end,
  })
  t.wait(3000, function()
    return undone ~= nil
  end, "reject_hunk")
  t.eq({ "def plus(a, b):", "    return a + b", "", "print(add(1, 2))" }, lines(bufnr), "buffer after undoing hunk 2")
  t.eq({ { 2, true, "", "SpeceditRemoved" } }, virtual(bufnr), "after undoing hunk 2")
  drawn = screen()
  t.eq(full_screen(), drawn, "the screen after undoing a hunk")
  for _, message in ipairs(messages_since(from)) do
    t.truthy(not message:find("left alone", 1, true), "message: " .. message)
  end
end)

t.it("live: a partial result at an older version leaves the marks where the text took them", function()
  local state = start("diff_stale.py", ORIGINAL)
  local bufnr = state.bufnr
  local written = write_all(state)
  server:partial(state.request, { delivery = "live", written = written })
  vim.api.nvim_buf_set_lines(bufnr, 0, 0, true, { "# typed" })
  server:partial(state.request, { delivery = "live", written = written }) -- its version is gone
  t.eq(3, #virtual(bufnr), "virtual lines")
  t.eq(1, virtual(bufnr)[1][1], "the first hunk's old line, moved with its text")
  server:reply(state.request, { status = "complete", delivery = "live", written = written })
  wait_result(state)
end)

t.it("live: a rewrite the server turns into a preview shows what it offers, and says why in one line", function()
  local original =
    { "def f(xs):", "    total = 0", "    for x in xs:", "        total += x", "    return total", "# end" }
  local state = start("guard.py", original)
  local bufnr = state.bufnr
  server:apply(bufnr, { { 1, 5, { "    pass" } } })
  local old = table.concat(original, "\n", 2, 5) .. "\n"
  local written = { version = version(bufnr), hunks = { hunk(0, fake.lines(1, 2), old, "    pass\n") } }
  server:partial(state.request, { delivery = "live", written = written })
  t.eq(1, vim.tbl_count(state.job.written), "the written hunk marked")
  -- The guard: the server takes out what it wrote, and offers it.
  server:apply(bufnr, { { 1, 2, vim.list_slice(original, 2, 5) } })
  server:partial(state.request, { delivery = "preview" })
  t.eq({}, virtual(bufnr), "no deleted lines shown once the server took its hunks out")
  local from = #echoed
  local offered = { version = version(bufnr), hunks = { hunk(0, fake.lines(1, 5), old, "    pass\n") } }
  server:reply(state.request, {
    status = "complete",
    delivery = "preview",
    offered = offered,
    message = "it removes 4 of 6 lines",
  })
  t.eq("complete", wait_result(state).status, "status")
  t.eq(original, lines(bufnr), "buffer: restored")
  t.eq({ { 4, false, "    pass", "SpeceditAdded" } }, virtual(bufnr), "the offered hunk as a preview")
  local said = messages_since(from)
  t.eq(1, #said, "messages: " .. vim.inspect(said))
  t.truthy(said[1]:find("it removes 4 of 6 lines", 1, true), said[1])
  server.on_command = function(command)
    if command == "specedit.accept" then
      server:apply(bufnr, { { 1, 5, { "    pass" } } })
      return { jobId = "job-1", applied = { 0 }, skipped = {} }
    end
  end
  local accepted
  specedit.accept({
    on_done = function(result)
      accepted = result
    end,
  })
  t.wait(3000, function()
    return accepted ~= nil
  end, "accept")
  t.eq("specedit.accept", server.commands[#server.commands].command, "command")
  t.eq({ "def f(xs):", "    pass", "# end" }, lines(bufnr), "buffer after accept")
  t.eq({}, virtual(bufnr), "virtual lines after accept")
end)

t.it(":SpeceditCancel on a live rewrite: the buffer restored, what it wrote offered to keep", function()
  local state = start("cancel.py", ORIGINAL)
  local bufnr = state.bufnr
  local written = write_all(state)
  server:partial(state.request, { delivery = "live", written = written })
  server.on_command = function(command)
    if command == "specedit.cancel" then
      vim.schedule(function() -- as the server does: restore, then answer the rewrite
        server:apply(bufnr, { { 0, 4, ORIGINAL } })
        local offered = {
          version = version(bufnr),
          hunks = {
            hunk(0, fake.lines(0, 1), "def add(a, b):\n", "def plus(a, b):\n"),
            hunk(1, fake.lines(2, 3), "\n", ""),
            hunk(2, fake.lines(4, 5), "print(add(1, 2))\n", "print(plus(1, 2))\n"),
          },
        }
        local result = { status = "cancelled", delivery = "preview", offered = offered, message = "cancelled" }
        server:reply(state.request, result)
      end)
      return { cancelled = { "job-1" } }
    end
  end
  local from = #echoed
  vim.cmd("SpeceditCancel")
  t.eq("cancelled", wait_result(state).status, "status")
  t.eq(ORIGINAL, lines(bufnr), "buffer: restored")
  t.eq({
    { 0, false, "def plus(a, b):", "SpeceditAdded" },
    { 4, false, "print(plus(1, 2))", "SpeceditAdded" },
  }, virtual(bufnr), "what it wrote, as a preview")
  local said = messages_since(from)
  t.eq(1, #said, "messages: " .. vim.inspect(said))
  t.truthy(said[1]:find("restored", 1, true) and said[1]:find(":SpeceditAccept", 1, true), said[1])
  server.on_command = function()
    return { jobId = "job-1", applied = {}, skipped = {} }
  end
  vim.cmd("SpeceditReject")
  t.wait(3000, function()
    return #virtual(bufnr) == 0
  end, "the preview to go")
  t.eq("specedit.reject", server.commands[#server.commands].command, "command")
end)

t.it("live: the window follows the writing position until the user moves, and again on the next rewrite", function()
  local many = {}
  for i = 1, 150 do
    many[i] = ("line %d"):format(i)
  end
  local state = start("follow.py", many)
  local function write_at(row)
    server:apply(state.bufnr, { { row, row + 1, { ("written %d"):format(row) } } })
    server:provisional(state.bufnr, row + 1, row + 2)
  end
  local function visible(line)
    return vim.fn.line("w0") <= line and line <= vim.fn.line("w$")
  end
  for _, row in ipairs({ 10, 60, 110 }) do
    write_at(row)
    t.eq(row + 2, vim.fn.line("."), "the cursor at the writing position")
    t.truthy(visible(row + 2) and visible(row + 6), "the writing position and the lines after it in view")
  end
  vim.cmd("normal! gg") -- the user moves away
  write_at(130)
  t.eq(1, vim.fn.line("."), "the cursor stays where the user put it")
  t.eq(1, vim.fn.line("w0"), "the view stays")
  server:reply(state.request, { status = "complete", delivery = "live" })
  wait_result(state)

  state = start("follow_again.py", many)
  write_at(40)
  t.eq(42, vim.fn.line("."), "the next rewrite is followed again")
  vim.cmd("normal! \5\5") -- the user scrolls
  local top = vim.fn.line("w0")
  write_at(100)
  t.eq(top, vim.fn.line("w0"), "the view stays where the user scrolled")
  t.truthy(vim.fn.line(".") < 100, "the cursor stays")
  server:reply(state.request, { status = "complete", delivery = "live" })
  wait_result(state)
end)

t.it("preview: virtual lines above the first line and below the last one are shown", function()
  local many = {}
  for i = 1, 40 do
    many[i] = ("line %d"):format(i)
  end
  local state = start("edges.py", many, { delivery = "preview" })
  local bufnr = state.bufnr
  server:partial(state.request, {
    delivery = "preview",
    hunks = {
      hunk(0, fake.lines(0, 0), "", "# header\n"),
      hunk(1, fake.lines(40, 40), "", "# footer 1\n# footer 2\n"),
    },
  })
  server:reply(state.request, { status = "complete", delivery = "preview" })
  wait_result(state)
  local rows = screen()
  t.eq({ "# header", "line 1" }, vim.list_slice(rows, 1, 2), "the top of the window")
  vim.cmd("normal! G")
  t.sleep(50) -- CursorMoved
  rows = screen()
  t.eq({ "line 40", "# footer 1", "# footer 2" }, vim.list_slice(rows, #rows - 2, #rows), "the bottom of the window")
  vim.cmd("normal! gg")
  t.sleep(50)
  t.eq({ "# header", "line 1" }, vim.list_slice(screen(), 1, 2), "the top again after gg")
end)

t.it("messages fit the command line, whatever their length", function()
  local state = start("long.py", ORIGINAL, { delivery = "preview" })
  local renamed = hunk(0, fake.lines(0, 1), "def add(a, b):\n", "def plus(a, b):\n")
  server:partial(state.request, { delivery = "preview", hunks = { renamed } })
  local from = #echoed
  server:reply(state.request, {
    status = "conflict",
    message = "the document was edited where the rewrite had not written yet, and that is a long story to tell",
  })
  wait_result(state)
  local said = messages_since(from)
  t.eq(1, #said, "messages: " .. vim.inspect(said))
  t.truthy(vim.endswith(said[1], "…"), "cut short: " .. said[1])
end)

t.it("the model option reaches the server: at its start, and from a later setup()", function()
  t.eq(vim.empty_dict(), server.initialize_params.initializationOptions, "settings at the start (none given)")
  specedit.setup({ cmd = server.cmd, delivery = "live", model = "qwen2.5-coder-1.5b-instruct" })
  local sent = server.notifications[#server.notifications]
  t.eq("workspace/didChangeConfiguration", sent.method, "notification")
  t.eq({ specedit = { model = "qwen2.5-coder-1.5b-instruct" } }, sent.params.settings, "settings sent")
  local asked = server.dispatchers.server_request("workspace/configuration", { items = { { section = "specedit" } } })
  t.eq({ { model = "qwen2.5-coder-1.5b-instruct" } }, asked, "workspace/configuration")
  t.eq("qwen2.5-coder-1.5b-instruct", require("specedit.config").server_settings().model, "server settings")
end)

t.it("an edit of the server that ends past the last line reaches the buffer in one change", function()
  local cases = {
    { "the last line replaced", { 4, 5, { "print(plus(1, 2))" } } },
    { "lines added after the last one", { 5, 5, { "x = 1", "y = 2" } } },
    { "the last lines deleted", { 3, 5, {} } },
  }
  for i, case in ipairs(cases) do
    local state = start(("end_%d.py"):format(i), ORIGINAL)
    local changes = 0
    vim.api.nvim_buf_attach(state.bufnr, false, {
      on_lines = function()
        changes = changes + 1
      end,
    })
    t.eq({ applied = true }, server:apply(state.bufnr, { case[2] }), case[1] .. ": applyEdit")
    local want = vim.list_extend(vim.list_slice(ORIGINAL, 1, case[2][1]), case[2][3])
    vim.list_extend(want, vim.list_slice(ORIGINAL, case[2][2] + 1, #ORIGINAL))
    t.eq(want, lines(state.bufnr), case[1] .. ": buffer")
    t.eq(true, vim.bo[state.bufnr].eol, case[1] .. ": 'eol'")
    t.eq(1, changes, case[1] .. ": changes")
    server:reply(state.request, { status = "complete", delivery = "live" })
    wait_result(state)
  end
end)
