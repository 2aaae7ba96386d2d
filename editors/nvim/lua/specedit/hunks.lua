--- The hunks a rewrite shows in a buffer, under the cursor: a preview's (preview.lua) and those a live
--- rewrite wrote (marked here until the user keeps or undoes them). Per-hunk commands and the buffer's
--- keymaps (`keymaps` in the options) act on them.
local config = require("specedit.config")
local preview = require("specedit.preview")

local M = {}

local HINT = "  specedit: keep / undo this hunk"

-- Put the hint on the first written hunk still marked, or take it away.
local function place_hint(job)
  local first
  for _, mark in pairs(job.written or {}) do
    local at = vim.api.nvim_buf_get_extmark_by_id(job.bufnr, preview.ns, mark, {})
    if at[1] and (not first or at[1] < first) then
      first = at[1]
    end
  end
  if not first then
    if job.written_hint then
      pcall(vim.api.nvim_buf_del_extmark, job.bufnr, preview.ns, job.written_hint)
      job.written_hint = nil
    end
    return
  end
  job.written_hint = vim.api.nvim_buf_set_extmark(job.bufnr, preview.ns, first, 0, {
    id = job.written_hint,
    virt_text = { { HINT, config.options.highlights.hint } },
    virt_text_pos = "eol",
  })
end

--- Mark the hunks a live rewrite wrote (`written`: the server's { version, hunks }, where each hunk's new
--- text is now): a sign and the added highlight on the new lines, and the old lines above them as deleted
--- virtual lines, until the hunk is kept or undone. While the rewrite runs, each report redraws them;
--- `final` (its end) adds the hint and the keymaps.
function M.mark_written(job, written, final)
  local bufnr = job.bufnr
  job.written = job.written or {}
  if not written or written == vim.NIL then
    M.unmark_written(job) -- nothing written (any more)
  elseif vim.lsp.util.buf_versions[bufnr] == written.version then
    M.unmark_written(job)
    local count = vim.api.nvim_buf_line_count(bufnr)
    local groups = config.options.highlights
    for _, hunk in ipairs(written.hunks) do
      local first, stop = preview.rows(hunk.range)
      local old = preview.virt_lines(hunk.oldText, groups.removed)
      local opts = { virt_lines = #old > 0 and old or nil, virt_lines_above = true }
      if stop > first then -- new lines: marked, the old ones above them
        opts.end_row, opts.end_col = math.min(stop, count) - 1, 0
        opts.sign_text, opts.sign_hl_group, opts.line_hl_group = "┃", groups.added, groups.added
      elseif first >= count then -- lines deleted at the end of the buffer: shown below its last line
        first, opts.virt_lines_above = count - 1, false
      end
      if first < count and (opts.end_row or opts.virt_lines) then
        job.written[hunk.id] = vim.api.nvim_buf_set_extmark(bufnr, preview.ns, first, 0, opts)
      end
    end
    preview.reveal(bufnr)
    preview.watch(bufnr)
  end -- else the user typed since: the marks drawn before moved with the text, the next report redraws
  if final then
    place_hint(job)
    M.keymaps(bufnr, next(job.written) ~= nil)
    if next(job.written) ~= nil then
      M.unmark_on_undo(job)
    end
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
          preview.redraw(bufnr)
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
  if job.written_hint then
    place_hint(job)
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
