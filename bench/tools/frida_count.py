#!/usr/bin/env python3
"""Spawn a target under Frida, count calls of one function, print the count.

  frida_count.py js|cmodule FUNC BINARY [ARGS...]

js:      Interceptor.attach with a JavaScript onEnter that increments a counter.
cmodule: Interceptor.attach with a CModule (C, compiled by Frida's TinyCC) onEnter.
The function is found in the main module's symbol table (.symtab), so the target
needs no -rdynamic. Prints "frida_count=N" on stderr after the target exits (sent from a hook on exit()).
"""
import sys
import threading

import frida

mode, func, argv = sys.argv[1], sys.argv[2], sys.argv[3:]

JS = """
const m = Process.mainModule;
const addr = m.findSymbolByName(FUNC) || m.findExportByName(FUNC);
if (addr === null) throw new Error('symbol not found: ' + FUNC);
let n = 0;
%s
// Report the count when the target calls exit(), and hold it there until the
// host side has the message (otherwise the process may be gone first).
Interceptor.attach(Module.getGlobalExportByName('exit'), {
  onEnter() { send({ count: %s }); recv('ack', () => {}).wait(); }
});
"""
JS_HOOK = "Interceptor.attach(addr, { onEnter() { n++; } });"
CM_HOOK = """
const counter = Memory.alloc(8);
counter.writeU64(0);
const cm = new CModule(`
  #include <gum/guminterceptor.h>
  extern volatile unsigned long long counter;
  void onEnter(GumInvocationContext *ic) { counter++; }
`, { counter });
Interceptor.attach(addr, cm);
"""

if mode == "js":
    src = JS % (JS_HOOK, "n")
elif mode == "cmodule":
    src = JS % (CM_HOOK, "counter.readU64().toString()")
else:
    sys.exit("mode must be js or cmodule")
src = src.replace("FUNC", repr(func))

device = frida.get_local_device()
pid = device.spawn(argv)
session = device.attach(pid)
done = threading.Event()
session.on("detached", lambda *a: done.set())
script = session.create_script(src)
errors = []
count = []


def on_message(msg, data):
    if msg.get("type") == "error":
        errors.append(msg.get("description"))
    elif msg.get("type") == "send":
        count.append(msg["payload"]["count"])
        script.post({"type": "ack"})


script.on("message", on_message)
script.load()
if errors:
    sys.exit(f"frida: {errors[0]}")
device.resume(pid)
done.wait(600)
if errors:
    sys.exit(f"frida: {errors[0]}")
print(f"frida_count={count[0] if count else 'unknown'}", file=sys.stderr)
