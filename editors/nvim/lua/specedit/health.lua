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
  if type(cmd) == "function" then
    health.info("server: cmd is a function (vim.lsp.start calls it): not checked from here")
    return
  end
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

  M.check_engine(cmd)

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

-- The value after `name` in the server command, else the `settings` key.
local function option(cmd, name, key)
  for i, part in ipairs(cmd) do
    if part == name then
      return cmd[i + 1]
    end
  end
  local value = require("specedit.config").server_settings()[key]
  return value ~= "" and value or nil
end

-- The command line (`specedit`) next to the server command, or nil.
local function cli_of(cmd)
  if cmd[2] == "-m" and cmd[3] == "specedit.lsp" then
    return { cmd[1], "-m", "specedit.cli.main" }
  end
  if cmd[2] == "lsp" then
    return { cmd[1] }
  end
  return nil
end

local function run(command)
  local ok, result = pcall(function()
    return vim.system(command, { text = true }):wait(20000)
  end)
  return ok and result.code == 0, ok and result.stdout or ""
end

--- The model the server will load (fetched yet?) and the engine it runs on (a daemon running yet?).
function M.check_engine(cmd)
  local health = vim.health
  local cli = cli_of(cmd)
  local model = option(cmd, "--model", "model")
  if model and model:find("/", 1, true) then
    if vim.fn.filereadable(model .. "/config.json") == 1 then
      health.ok("model: " .. model)
    else
      health.error("model: no model at " .. model .. " (no config.json)", { "Set --model (or settings.model) to a model folder or name" })
    end
  elseif cli then
    local name = model or "qwen2.5-coder-0.5b-instruct"
    local ok, listed = run(vim.list_extend(vim.deepcopy(cli), { "model", "list" }))
    local line = ok and vim.iter(vim.split(listed, "\n")):find(function(l)
      return vim.startswith(l, name .. " ")
    end)
    if line then
      health.ok("model: " .. vim.trim(line))
    else
      health.warn(("model: %s is not fetched yet; the first rewrite fetches it"):format(name), {
        ("Fetch it now: %s model fetch %s"):format(table.concat(cli, " "), name),
      })
    end
  end

  local engine = option(cmd, "--engine", "engine")
  if engine == "inprocess" then
    health.info("engine: in the server's own process (--engine inprocess): it loads the model on the first rewrite")
  elseif engine and not (vim.startswith(engine, "/") or vim.startswith(engine, "unix:")) then
    health.info(("engine: %s (a daemon elsewhere: not checked from here)"):format(engine))
  elseif cli then
    local status = vim.list_extend(vim.deepcopy(cli), { "serve", "--status" })
    if engine then
      vim.list_extend(status, { "--socket", (engine:gsub("^unix:", "")) })
    end
    local ok, output = run(status)
    local info = ok and pcall(vim.json.decode, output) and vim.json.decode(output)
    if type(info) == "table" and info.pid then
      health.ok(("engine daemon: running (pid %s, model %s, %s)"):format(info.pid, tostring(info.model), tostring(info.state)))
    else
      health.info("engine daemon: none running; the first rewrite starts one, which loads the model (seconds)")
    end
  end
end

return M
