--- :checkhealth specedit
local M = {}

function M.check()
  local health = vim.health
  local config = require("specedit.config")
  health.start("specedit")

  if vim.fn.has("nvim-0.10") == 1 then
    health.ok("Neovim " .. tostring(vim.version()))
  else
    health.error("Neovim 0.10 or later is needed")
  end

  local cmd = config.options.cmd
  if type(cmd) ~= "table" or #cmd == 0 then
    health.error("no server command: set `cmd` in require('specedit').setup()")
    return
  end
  local shown = table.concat(cmd, " ")
  local executable = vim.fn.exepath(cmd[1])
  if executable == "" then
    health.error(("server executable not found: %s (command: %s)"):format(cmd[1], shown), {
      "Install specedit where Neovim can find it: pip install specedit (it provides `specedit lsp`)",
      "or point the plugin at it: require('specedit').setup({ cmd = { '/path/to/venv/bin/specedit', 'lsp' } })",
    })
  else
    -- The server prints its usage quickly, without loading a model: a broken installation shows here.
    local ok, result = pcall(function()
      return vim.system(vim.list_extend(vim.deepcopy(cmd), { "--help" }), { text = true }):wait(20000)
    end)
    if ok and result.code == 0 then
      health.ok(("server: %s (%s)"):format(shown, executable))
    else
      local output = ok and vim.trim((result.stderr or "") .. (result.stdout or "")) or tostring(result)
      health.error(("the server does not start: %s --help failed"):format(shown), { output:sub(1, 500) })
    end
  end

  local clients = vim.lsp.get_clients({ name = "specedit" })
  if #clients == 0 then
    health.info("no specedit server running (it starts on the first rewrite)")
  end
  for _, client in ipairs(clients) do
    health.info(("server running: client %d, %d buffer(s), encoding %s"):format(
      client.id,
      vim.tbl_count(client.attached_buffers or {}),
      client.offset_encoding
    ))
  end
end

return M
