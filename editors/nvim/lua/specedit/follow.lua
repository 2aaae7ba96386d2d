--- The window that follows a live rewrite: its cursor goes where the server writes, and the view scrolls
--- with it. Once the user moves the cursor or scrolls, the window is theirs until the next rewrite.
---
--- The user's doing is told from the plugin's own by the view: after each change of ours (an edit of the
--- server, the marks drawn, a move) `settle` notes the view; a view that differs from the note at the next
--- change of ours was changed by someone else.
local M = {}

---@type table<integer, { win: integer, key: integer, view: integer[] }>
local following = {} -- bufnr -> the window following its live rewrite

-- The cursor and the top line. line("w0") validates the top line first, as a redraw would.
local function view_of(win)
  local cursor = vim.api.nvim_win_get_cursor(win)
  return { cursor[1], cursor[2], vim.fn.line("w0", win) }
end

local function state_of(bufnr)
  local state = following[bufnr]
  if state and vim.api.nvim_win_is_valid(state.win) and vim.api.nvim_win_get_buf(state.win) == bufnr then
    return state
  end
  following[bufnr] = nil
  return nil
end

--- A live rewrite starts: the current window follows it, if it shows the rewrite's buffer.
---@param job specedit.Job
function M.start(job)
  local win = vim.api.nvim_get_current_win()
  following[job.bufnr] = nil
  if vim.api.nvim_win_get_buf(win) == job.bufnr then
    following[job.bufnr] = { win = win, key = job.key, view = view_of(win) }
  end
end

--- The rewrite ended (or became a preview): no more following.
---@param job specedit.Job
function M.stop(job)
  local state = following[job.bufnr]
  if state and state.key == job.key then
    following[job.bufnr] = nil
  end
end

--- Before a change of ours: stop following if the user moved or scrolled since the last one.
function M.check(bufnr)
  local state = state_of(bufnr)
  if state and not vim.deep_equal(state.view, view_of(state.win)) then
    following[bufnr] = nil
  end
end

--- After a change of ours: note the view it left.
function M.settle(bufnr)
  local state = state_of(bufnr)
  if state then
    state.view = view_of(state.win)
  end
end

--- Whether a window follows the buffer's rewrite.
function M.active(bufnr)
  return state_of(bufnr) ~= nil
end

--- Move the following window's cursor to `row` (0-based), the writing position, and scroll so that a third
--- of the window shows the lines below it, which the rewrite reaches next.
function M.to(bufnr, row)
  M.check(bufnr)
  local state = state_of(bufnr)
  if not state then
    return
  end
  local win = state.win
  local line = math.max(1, math.min(row + 1, vim.api.nvim_buf_line_count(bufnr)))
  vim.api.nvim_win_set_cursor(win, { line, 0 })
  local height = vim.api.nvim_win_get_height(win)
  local below = math.floor(height / 3)
  if line < vim.fn.line("w0", win) or line > vim.fn.line("w$", win) - below then
    local topline = math.max(1, line - (height - below) + 1)
    vim.api.nvim_win_call(win, function()
      vim.fn.winrestview({ topline = topline })
    end)
  end
  state.view = view_of(win)
end

return M
