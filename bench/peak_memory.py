"""Peak resident memory of this process (Linux VmHWM), reset before a measured call."""


def vmhwm() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def peak_growth(fn) -> int:
    """Bytes by which the peak RSS grew while fn() ran (the peak is reset first)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = vmhwm()
    fn()
    return vmhwm() - base
