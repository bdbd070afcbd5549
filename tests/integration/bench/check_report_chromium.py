#!/usr/bin/env python3
"""`kvbridge bench --report` rendered in headless Chromium (issue 34): the
page that check_views.py wrote (views.html, its expected counts in
views.expect) is loaded from file:// with the network unused.

- --dump-dom: the page's own script ran (it writes "N room rows, F failed"
  into #rows from the SVG it finds) and N and F are the trace's room slices
  and failed ones;
- --screenshot with --enable-logging=stderr: the script's console line is in
  the log (so console output is captured at all), no console error or
  uncaught exception is; the screenshot (kept as views.png in OUTDIR) shows
  the transfer stage's blue, a decode stage's purple and the failure red.

Exit 77 (CTest skip) with a message when Debian's chromium is not installed.
usage: check_report_chromium.py OUTDIR
"""
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-extensions", "--virtual-time-budget=3000"]


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def chromium(args, profile):
    cmd = [BIN, *FLAGS, "--user-data-dir=" + profile, *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    if r.returncode != 0:
        print(r.stdout[-2000:], r.stderr[-4000:])
        fail("chromium exited %d" % r.returncode)
    return r


def png_pixels(path):
    """(width, height, set of RGB tuples) of an 8-bit RGB/RGBA PNG."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        fail("screenshot is not a PNG")
    pos, idat, w = 8, b"", 0
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, ctype = struct.unpack(">IIBB", body[:10])
            if depth != 8 or ctype not in (2, 6):
                fail("unexpected PNG format %d/%d" % (depth, ctype))
            bpp = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw, stride = zlib.decompress(idat), w * bpp
    prev, colours = bytearray(stride), set()
    for y in range(h):
        ft, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b, c = prev[x], prev[x - bpp] if x >= bpp else 0
            if ft == 1:
                line[x] = (line[x] + a) & 255
            elif ft == 2:
                line[x] = (line[x] + b) & 255
            elif ft == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif ft == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        for x in range(0, stride, bpp):
            colours.add(tuple(line[x:x + 3]))
        prev = line
    return w, h, colours


def main():
    out = sys.argv[1]
    html, expect = os.path.join(out, "views.html"), os.path.join(out, "views.expect")
    if not os.path.exists(html) or not os.path.exists(expect):
        fail("no %s / %s: bench_views must run first (fixture)" % (html, expect))
    with open(expect) as f:
        want = json.load(f)
    url = "file://" + os.path.abspath(html)
    with tempfile.TemporaryDirectory(dir=out) as profile:
        dom = chromium(["--dump-dom", url], profile).stdout
        m = re.search(r'<p id="rows">(\d+) room rows, (\d+) failed</p>', dom)
        if m is None:
            fail("the page's script did not fill #rows (did it run?)")
        if (int(m.group(1)), int(m.group(2))) != (want["rows"], want["failed"]):
            fail("rendered %s rows / %s failed, trace has %d / %d" %
                 (m.group(1), m.group(2), want["rows"], want["failed"]))
        shot = os.path.join(out, "views.png")
        if os.path.exists(shot):
            os.unlink(shot)
        log = chromium(["--enable-logging=stderr", "--v=0", "--window-size=1400,1800",
                        "--screenshot=" + shot, url], profile).stderr
    console = [l for l in log.splitlines() if "CONSOLE" in l]
    print("\n".join(console))
    if not any("kvbridge report: %d room rows" % want["rows"] in l for l in console):
        fail("the script's console line is not in chromium's log: console not captured")
    bad = [l for l in console if ":ERROR:CONSOLE" in l or "Uncaught" in l or "Error" in l]
    if bad:
        fail("console errors: %s" % bad)
    if not os.path.exists(shot):
        fail("no screenshot written")
    w, h, colours = png_pixels(shot)
    for name, rgb in (("transfer", (0x21, 0x71, 0xb5)), ("wait_prefill", (0x80, 0x7d, 0xba)),
                      ("failure", (0xd7, 0x19, 0x1c))):
        if rgb not in colours:
            fail("the screenshot has no %s colour #%02x%02x%02x" % ((name,) + rgb))
    print("rendered %d rows (%d failed); screenshot %s %dx%d, %d colours" %
          (want["rows"], want["failed"], shot, w, h, len(colours)))
    print("PASS")


BIN = shutil.which("chromium") or shutil.which("chromium-browser")
if __name__ == "__main__":
    if BIN is None:
        print("SKIP: chromium not installed (Debian: apt-get install chromium; "
              "scripts/install-deps.sh --optional installs it)")
        sys.exit(77)
    main()
