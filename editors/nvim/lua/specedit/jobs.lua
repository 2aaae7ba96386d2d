--- The rewrites this Neovim has asked for: one table per request, found by buffer or by partial-result token.
---
--- A job lives from `rewrite()` until its response (`done`), and a little longer: accept and reject act on
--- the latest job of a buffer, finished or not.
local M = {}

---@class specedit.Job
---@field key integer            this plugin's number for the job
---@field id string?             the server's jobId (known from the first partial result or the response)
---@field bufnr integer
---@field delivery "live"|"preview"|"final"
---@field instruction string?
---@field partial_token string   the partialResultToken: its $/progress goes to our renderer
---@field progress_token string  the workDoneToken: its $/progress goes to Neovim (vim.lsp.status())
---@field client_id integer?
---@field hunks table[]          every hunk reported so far ({id, range, newText, oldText}, request
---                              coordinates; once `offered`: the offered ones, where their old text is)
---@field stats table?           the latest stats (partial results, then the final ones)
---@field done boolean
---@field result table?          the final response ({jobId, status, stats, message?})
---@field on_done fun(result: table)?
---@field marks table            preview extmarks (preview.lua)
---@field written table?         hunk id -> the extmark of a hunk a live rewrite wrote (hunks.lua)
---@field offered boolean?       a live rewrite the server turned into a preview (its hunks in `marks`)

local next_key = 0

---@type table<string, specedit.Job>
M.by_token = {}
---@type table<integer, specedit.Job>
M.latest = {} -- bufnr -> the latest job in that buffer

--- The undo sequence number each buffer had right after our last edit, while a rewrite writes into it:
--- the next edit of the same rewrite is joined to it (`:undojoin`), unless something happened in between.
---@type table<integer, integer?>
M.undo_seq = {}

---@return specedit.Job
function M.new(bufnr, delivery, instruction, on_done)
  next_key = next_key + 1
  local pid = vim.fn.getpid()
  local job = {
    key = next_key,
    bufnr = bufnr,
    delivery = delivery,
    instruction = instruction,
    partial_token = ("specedit-partial-%d-%d"):format(pid, next_key),
    progress_token = ("specedit-progress-%d-%d"):format(pid, next_key),
    hunks = {},
    done = false,
    on_done = on_done,
    marks = {},
  }
  M.by_token[job.partial_token] = job
  M.latest[bufnr] = job
  M.undo_seq[bufnr] = nil -- a new rewrite: a new undo step
  return job
end

---@return specedit.Job?
function M.for_buffer(bufnr)
  return M.latest[bufnr]
end

---@return specedit.Job?
function M.for_token(token)
  return M.by_token[token]
end

--- A running job in any buffer (the latest one), for `:SpeceditCancel` from another window.
---@return specedit.Job?
function M.any_running()
  local found
  for _, job in pairs(M.latest) do
    if not job.done and (not found or job.key > found.key) then
      found = job
    end
  end
  return found
end

function M.forget(job)
  M.by_token[job.partial_token] = nil
  if M.latest[job.bufnr] == job then
    M.latest[job.bufnr] = nil
  end
end

return M
