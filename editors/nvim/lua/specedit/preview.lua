--- Preview rendering: each hunk's new lines as virtual lines under the lines they replace, which are
--- highlighted as removed. Nothing is written to the buffer until :SpeceditAccept.
---
--- Hunks come in the coordinates of the request's version. The user may type while the rewrite runs, so
--- when a preview starts, every line of the region gets an anchor extmark; a hunk's line is looked up
--- through its anchor, which Neovim moves along with the text.
local config = require("specedit.config")

local M = {}

M.ns = vim.api.nvim_create_namespace("specedit")

--- The rows a whole-line LSP range covers: first, and stop (exclusive). Whole-line ranges end at the start
--- of the next line; at the end of a file without a final newline, they end inside the last line.
function M.rows(range)
  local stop = range["end"].character > 0 and range["end"].line + 1 or range["end"].line
  return range.start.line, stop
end

function M.define_highlights()
  local groups = config.options.highlights
  vim.api.nvim_set_hl(0, groups.added, { link = "DiffAdd", default = true })
  vim.api.nvim_set_hl(0, groups.removed, { link = "DiffDelete", default = true })
  vim.api.nvim_set_hl(0, groups.hint, { link = "Comment", default = true })
  vim.api.nvim_set_hl(0, groups.pending, { link = "DiffChange", default = true })
end

local pending = {} -- bufnr -> the extmark over the lines a live rewrite is still writing

--- Mark the lines `range` covers (an LSP range: whole lines) as pending, or clear the mark (nil).
function M.pending(bufnr, range)
  if pending[bufnr] then
    pcall(vim.api.nvim_buf_del_extmark, bufnr, M.ns, pending[bufnr])
    pending[bufnr] = nil
  end
  if not range or not vim.api.nvim_buf_is_valid(bufnr) then
    return
  end
  local first, stop = M.rows(range)
  local last = stop - 1
  if last < first or last >= vim.api.nvim_buf_line_count(bufnr) then
    return
  end
  pending[bufnr] = vim.api.nvim_buf_set_extmark(bufnr, M.ns, range.start.line, 0, {
    end_row = last,
    end_col = 0,
    line_hl_group = config.options.highlights.pending,
    priority = 150, -- no sign: Neovim 0.11 can leave a deleted range mark's sign drawn until a full redraw
  })
end

--- The lines marked pending in `bufnr` (0-based, inclusive), or nil.
function M.pending_lines(bufnr)
  local found = pending[bufnr] and vim.api.nvim_buf_get_extmark_by_id(bufnr, M.ns, pending[bufnr], { details = true })
  if not found or not found[1] then
    return nil
  end
  return found[1], found[3].end_row or found[1]
end

--- Anchor the lines `first`..`last` (0-based, inclusive) of the region, and the line after it.
function M.anchor(job, first, last)
  local count = vim.api.nvim_buf_line_count(job.bufnr)
  job.anchors = {}
  for line = first, math.min(last + 1, count - 1) do
    job.anchors[line] = vim.api.nvim_buf_set_extmark(job.bufnr, M.ns, line, 0, {})
  end
end

-- The current row of the request's line `line`.
local function row_of(job, line)
  local anchor = job.anchors and job.anchors[line]
  if anchor then
    local position = vim.api.nvim_buf_get_extmark_by_id(job.bufnr, M.ns, anchor, {})
    if position[1] then
      return position[1]
    end
  end
  return line
end

--- The lines of a hunk's text (its last line end dropped, "\r" of CRLF too).
function M.text_lines(text)
  local lines = vim.split(text or "", "\n", { plain = true })
  if lines[#lines] == "" then
    table.remove(lines)
  end
  for i, line in ipairs(lines) do
    lines[i] = line:gsub("\r$", "")
  end
  return lines
end
local text_lines = M.text_lines

--- `text` as virtual lines in the highlight `group`.
function M.virt_lines(text, group)
  local lines = {}
  for _, line in ipairs(text_lines(text)) do
    lines[#lines + 1] = { { line, group } }
  end
  return lines
end

-- --------------------------------------------------------------------------------------------- edges

-- How many virtual lines of ours stand above the buffer's first line, and below its last.
local function edge_fill(bufnr)
  local above, below = 0, 0
  local last = vim.api.nvim_buf_line_count(bufnr) - 1
  for _, row in ipairs(last > 0 and { 0, last } or { 0 }) do
    for _, mark in ipairs(vim.api.nvim_buf_get_extmarks(bufnr, M.ns, { row, 0 }, { row, -1 }, { details = true })) do
      local details = mark[4]
      if details.virt_lines and details.virt_lines_above and row == 0 then
        above = above + #details.virt_lines
      elseif details.virt_lines and not details.virt_lines_above and row == last then
        below = below + #details.virt_lines
      end
    end
  end
  return above, below
end

-- Screen rows from `line` (1-based) to the end of the buffer, virtual lines below the last included.
local function rows_from(win, line)
  local all = vim.api.nvim_win_text_height(win, { start_row = line - 1 }).all
  return all - vim.api.nvim_win_text_height(win, { start_row = line - 1, end_row = line - 1 }).fill
end

--- Bring into view the virtual lines at the buffer's edges, in the windows that show those edges. Neovim
--- shows virtual lines above the first line only when the window is scrolled up into them ('topfill'),
--- and those below the last line only when scrolled past it.
function M.reveal(bufnr)
  if not vim.api.nvim_buf_is_loaded(bufnr) then
    return
  end
  local above, below = edge_fill(bufnr)
  if above == 0 and below == 0 then
    return
  end
  local count = vim.api.nvim_buf_line_count(bufnr)
  for _, win in ipairs(vim.fn.win_findbuf(bufnr)) do
    vim.api.nvim_win_call(win, function()
      local view = vim.fn.winsaveview()
      if above > 0 and view.topline == 1 and view.topfill < above then
        vim.fn.winrestview({ topline = 1, topfill = above })
        view = vim.fn.winsaveview()
      end
      if below > 0 and vim.fn.line("w$") == count then
        local height, cursor, top = vim.api.nvim_win_get_height(win), vim.fn.line("."), view.topline
        while top < cursor and rows_from(win, top) > height do
          top = top + 1
        end
        if top ~= view.topline then
          vim.fn.winrestview({ topline = top, topfill = 0 })
        end
      end
    end)
  end
end

--- Reveal the edges again whenever the cursor comes to the first or the last line (`gg`, `G`).
function M.watch(bufnr)
  local group = vim.api.nvim_create_augroup("specedit_edges_" .. bufnr, { clear = true })
  vim.api.nvim_create_autocmd("CursorMoved", {
    group = group,
    buffer = bufnr,
    callback = function()
      local line = vim.fn.line(".")
      if line == 1 or line == vim.api.nvim_buf_line_count(bufnr) then
        M.reveal(bufnr)
      end
    end,
  })
  vim.api.nvim_create_autocmd("BufWipeout", {
    group = group,
    buffer = bufnr,
    callback = function()
      pcall(vim.api.nvim_del_augroup_by_id, group)
    end,
  })
end

--- Redraw the windows of `bufnr` from scratch. Taking away virtual lines and signs together with the
--- lines they stood by can leave rows drawn twice in the terminal until a full redraw (Ctrl-L).
function M.redraw(bufnr)
  if vim.api.nvim_buf_is_valid(bufnr) then
    pcall(vim.api.nvim__redraw, { buf = bufnr, valid = false })
  end
end

--- Show the hunks (their ids become the keys of `job.marks`).
function M.add(job, hunks)
  local bufnr, groups = job.bufnr, config.options.highlights
  if not vim.api.nvim_buf_is_valid(bufnr) then
    return
  end
  local count = vim.api.nvim_buf_line_count(bufnr)
  for _, hunk in ipairs(hunks) do
    local marks = {}
    local first, stop = M.rows(hunk.range)
    for line = first, stop - 1 do
      local row = row_of(job, line)
      if row < count then
        marks[#marks + 1] = vim.api.nvim_buf_set_extmark(bufnr, M.ns, row, 0, {
          line_hl_group = groups.removed,
          priority = 200,
        })
      end
    end
    local virt_lines = M.virt_lines(hunk.newText, groups.added)
    if #virt_lines > 0 then
      local row, above
      if stop > first then
        row, above = row_of(job, stop - 1), false -- under the lines it replaces
      elseif first < count then
        row, above = row_of(job, first), true -- a pure insertion before line `first`
      else
        row, above = count - 1, false -- an insertion at the end of the buffer
      end
      marks[#marks + 1] = vim.api.nvim_buf_set_extmark(bufnr, M.ns, math.min(row, count - 1), 0, {
        virt_lines = virt_lines,
        virt_lines_above = above,
      })
    end
    if not job.hint then
      job.hint = vim.api.nvim_buf_set_extmark(bufnr, M.ns, math.min(row_of(job, first), count - 1), 0, {
        virt_text = { { "  specedit: :SpeceditAccept / :SpeceditReject", groups.hint } },
        virt_text_pos = "eol",
      })
    end
    job.marks[hunk.id] = marks
  end
  M.reveal(bufnr)
  M.watch(bufnr)
end

--- Remove the preview of some hunks (ids), or of the whole job (nil), anchors included.
function M.clear(job, hunk_ids)
  local bufnr = job.bufnr
  if not vim.api.nvim_buf_is_valid(bufnr) then
    job.marks = {}
    return
  end
  local function delete(mark)
    pcall(vim.api.nvim_buf_del_extmark, bufnr, M.ns, mark)
  end
  for _, id in ipairs(hunk_ids or vim.tbl_keys(job.marks)) do
    for _, mark in ipairs(job.marks[id] or {}) do
      delete(mark)
    end
    job.marks[id] = nil
  end
  if next(job.marks) == nil then
    if job.hint then
      delete(job.hint)
      job.hint = nil
    end
    for _, anchor in pairs(job.anchors or {}) do
      delete(anchor)
    end
    job.anchors = nil
  elseif job.hint and hunk_ids then
    M.move_hint(job)
  end
  if hunk_ids then
    M.redraw(bufnr)
  end
end

--- Put the preview's hint on the first hunk still shown.
function M.move_hint(job)
  local first
  for _, marks in pairs(job.marks) do
    for _, mark in ipairs(marks) do
      local at = vim.api.nvim_buf_get_extmark_by_id(job.bufnr, M.ns, mark, {})
      if at[1] and (not first or at[1] < first) then
        first = at[1]
      end
    end
  end
  if first then
    vim.api.nvim_buf_set_extmark(job.bufnr, M.ns, first, 0, {
      id = job.hint,
      virt_text = { { "  specedit: :SpeceditAccept / :SpeceditReject", config.options.highlights.hint } },
      virt_text_pos = "eol",
    })
  end
end

return M
