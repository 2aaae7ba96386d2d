-- specedit's user commands. Nothing else happens at startup: the modules load on first use.
if vim.g.loaded_specedit or vim.fn.has("nvim-0.10") ~= 1 then
  return
end
vim.g.loaded_specedit = true

local command = vim.api.nvim_create_user_command

command("SpeceditRewrite", function(args)
  require("specedit")._command_rewrite(args)
end, {
  nargs = "*",
  range = true,
  bang = true,
  desc = "specedit: rewrite the range (default: the whole buffer) as instructed; ! for a preview",
})
command("SpeceditApply", function(args)
  require("specedit")._command_apply(args)
end, {
  nargs = "?",
  range = true,
  bang = true,
  desc = "specedit: merge the edit sketch in a register (default: the clipboard) into the range or buffer; "
    .. "a preview, ! to write it live",
})
command("SpeceditAccept", function()
  require("specedit").accept()
end, { desc = "specedit: write the previewed (or pending) rewrite" })
command("SpeceditReject", function()
  require("specedit").reject()
end, { desc = "specedit: drop the rewrite and restore the original" })
command("SpeceditAcceptHunk", function()
  require("specedit").accept_hunk()
end, { desc = "specedit: keep (written) or write (previewed) the hunk under the cursor" })
command("SpeceditRejectHunk", function()
  require("specedit").reject_hunk()
end, { desc = "specedit: undo (written) or drop (previewed) the hunk under the cursor" })
command("SpeceditNextHunk", function()
  require("specedit").jump(1)
end, { desc = "specedit: the next hunk" })
command("SpeceditPrevHunk", function()
  require("specedit").jump(-1)
end, { desc = "specedit: the previous hunk" })
command("SpeceditCancel", function()
  require("specedit").cancel()
end, { desc = "specedit: stop the running rewrite" })
