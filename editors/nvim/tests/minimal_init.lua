-- The init file of the headless spec runs (tests/test_nvim.py): the plugin on the runtimepath, nothing else.
-- The XDG_* folders are temporary ones, set by the caller, so no user configuration is read.
local tests = vim.fn.fnamemodify(debug.getinfo(1, "S").source:sub(2), ":p:h")
local root = vim.fn.fnamemodify(tests, ":h")
vim.opt.runtimepath:prepend(root)
vim.opt.swapfile = false
vim.opt.shadafile = "NONE"
vim.opt.more = false
package.path = tests .. "/?.lua;" .. package.path
vim.lsp.set_log_level("WARN") -- the server's stderr lands in $XDG_STATE_HOME/nvim/lsp.log
