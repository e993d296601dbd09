# The README's two set-up commands: `make demo` and `make test`. Each installs what it needs into .venv.
VENV ?= .venv
PYTHON ?= python3
TORCH ?= torch==2.14.1 torchvision==0.29.1
BIN := $(VENV)/bin
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: demo test install system-packages

demo: install
	$(BIN)/bytesplat-demo

test: install
	$(BIN)/python -m pytest -q

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	@$(MAKE) --no-print-directory system-packages
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -qq $(TORCH) -e '.[test]'
	touch $@

# open3d (imported by nerfstudio's point-cloud loader and ns-export) needs libusb-1.0; ffmpeg turns the
# demo's fly-through into an mp4 (without it the demo writes PNG frames); tests/test_viewer_browser.py opens
# the viewer in headless chromium.
system-packages:
	@if ! ldconfig -p | grep -q 'libusb-1.0.so.0' || ! command -v ffmpeg >/dev/null || ! command -v chromium >/dev/null; then \
	  if command -v apt-get >/dev/null; then \
	    $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq libusb-1.0-0 ffmpeg chromium >/dev/null; \
	  elif ! ldconfig -p | grep -q 'libusb-1.0.so.0'; then \
	    echo "Install libusb-1.0 with your system's package manager (open3d needs it), then run make again."; exit 1; \
	  fi; \
	fi
