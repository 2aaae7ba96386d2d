import json


def load_config(path):
    with open(path) as handle:
        data = json.load(handle)
    result = {}
    for key in data:
        if key.startswith("_"):
            continue
        result[key] = data[key]
    return result


def save_config(path, config):
    with open(path, "w") as handle:
        json.dump(config, handle, indent=2)


def merge(base, override):
    merged = dict(base)
    for key, value in override.items():
        merged[key] = value
    return merged
