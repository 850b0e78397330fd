"""Run a module's CLI in a child Python with every TCP/UDP connection and DNS lookup
refused (an audit hook): an offline dry run that reaches for the network fails, not hangs."""

_SCRIPT = """
import runpy, socket, sys
def refuse(event, args):
    if event == "socket.getaddrinfo" or (event == "socket.connect" and args[0].family != socket.AF_UNIX):
        raise RuntimeError(f"network access during dry run: {{event}} {{args[1:]}}")
sys.addaudithook(refuse)
sys.argv = ["{module}"] + sys.argv[1:]
runpy.run_module("{module}", run_name="__main__")
"""


def script(module: str) -> str:
    """`python -c` source that runs `module` as __main__ with the network refused."""
    return _SCRIPT.format(module=module)
