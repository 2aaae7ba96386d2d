--- The hunks a rewrite shows in a buffer, under the cursor: a preview's (preview.lua) and those a live
--- rewrite wrote (marked here until the user keeps or undoes them). Per-hunk commands and the buffer's
--- keymaps (`keymaps` in the options) act on them.
local config = require("specedit.config")
local preview = require("specedit.preview")

local M = {}

--- Mark the hunks a rewrite wrote (`written`: the server's { version, hunks }), with a sign and a hint.
function M.mark_written(job, written)
  local bufnr = job.bufnr
  job.written = {}
  if not written or written == vim.NIL or vim.lsp.util.buf_versions[bufnr] ~= written.version then
    return -- the user typed since: the ranges are of another version
  end
  local count = vim.api.nvim_buf_line_count(bufnr)
  for _, hunk in ipairs(written.hunks) do
    local first, stop = preview.rows(hunk.range)
    if first < count then
      job.written[hunk.id] = vim.api.nvim_buf_set_extmark(bufnr, preview.ns, first, 0, {
        end_row = math.min(math.max(stop, first + 1), count) - 1,
        end_col = 0,
        sign_text = "┃",
        sign_hl_group = config.options.highlights.added,
        virt_text = next(job.written) == nil and { { "  specedit: keep / undo this hunk", config.options.highlights.hint } }
          or nil,
        virt_text_pos = "eol",
      })
    end
  end
  M.keymaps(bufnr, next(job.written) ~= nil)
  if next(job.written) ~= nil then
    M.unmark_on_undo(job)
  end
end

--- Once the user undoes the rewrite (`u` past its undo step), its hunks are no longer marked.
function M.unmark_on_undo(job)
  local bufnr = job.bufnr
  local written_at = vim.fn.undotree(bufnr).seq_cur
  local done = false
  vim.api.nvim_buf_attach(bufnr, false, {
    on_lines = function()
      if done or next(job.written or {}) == nil then
        return true -- kept or undone hunk by hunk, or replaced by the next rewrite: detach
      end
      vim.schedule(function()
        if not done and vim.api.nvim_buf_is_valid(bufnr) and vim.fn.undotree(bufnr).seq_cur < written_at then
          done = true
          M.unmark_written(job)
          M.keymaps(bufnr, false)
        end
      end)
    end,
  })
end

--- Forget the marks of written hunks (`ids`, or all).
function M.unmark_written(job, ids)
  for _, id in ipairs(ids or vim.tbl_keys(job.written or {})) do
    if job.written and job.written[id] then
      pcall(vim.api.nvim_buf_del_extmark, job.bufnr, preview.ns, job.written[id])
      job.written[id] = nil
    end
  end
end

-- Each hunk shown for `job`: { id, first, last (rows, inclusive), written }.
local function shown(job)
  local found = {}
  local function add(id, mark, written)
    local at = vim.api.nvim_buf_get_extmark_by_id(job.bufnr, preview.ns, mark, { details = true })
    if at[1] then
      found[#found + 1] = { id = id, first = at[1], last = at[3].end_row or at[1], written = written }
    end
  end
  for id, marks in pairs(job.marks or {}) do
    for _, mark in ipairs(marks) do
      add(id, mark, false)
    end
  end
  for id, mark in pairs(job.written or {}) do
    add(id, mark, true)
  end
  table.sort(found, function(a, b)
    return a.first < b.first
  end)
  return found
end

--- The hunk under the cursor (or the nearest one below it on the same row span), or nil.
function M.at_cursor(job)
  local row = vim.api.nvim_win_get_cursor(0)[1] - 1
  for _, hunk in ipairs(shown(job)) do
    if hunk.first <= row and row <= hunk.last then
      return hunk
    end
  end
  return nil
end

--- Move the cursor to the next (direction 1) or previous (-1) hunk; false when there is none.
function M.jump(job, direction)
  local row = vim.api.nvim_win_get_cursor(0)[1] - 1
  local hunks = shown(job)
  local from, to, step = 1, #hunks, 1
  if direction < 0 then
    from, to, step = #hunks, 1, -1
  end
  for i = from, to, step do
    local first = hunks[i].first
    if (direction > 0 and first > row) or (direction < 0 and first < row) then
      vim.api.nvim_win_set_cursor(0, { first + 1, 0 })
      return true
    end
  end
  return false
end

--- Set (on) or remove (off) the buffer's keymaps for hunks, as `keymaps` in the options say.
function M.keymaps(bufnr, on)
  local maps = config.options.keymaps
  if not maps or not vim.api.nvim_buf_is_valid(bufnr) then
    return
  end
  local actions = {
    accept_hunk = { "SpeceditAcceptHunk", "specedit: keep / write the hunk under the cursor" },
    reject_hunk = { "SpeceditRejectHunk", "specedit: undo / drop the hunk under the cursor" },
    next_hunk = { "SpeceditNextHunk", "specedit: next hunk" },
    prev_hunk = { "SpeceditPrevHunk", "specedit: previous hunk" },
  }
  for name, keys in pairs(maps) do
    local action = actions[name]
    if action and keys then
      if on then
        vim.keymap.set("n", keys, "<Cmd>" .. action[1] .. "<CR>", { buffer = bufnr, desc = action[2] })
      else
        pcall(vim.keymap.del, "n", keys, { buffer = bufnr })
      end
    end
  end
end

return M
