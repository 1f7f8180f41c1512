"""``corral mcp``: corral's MCP server, so that an agent can start and follow other agents.

``tools.py`` holds the tools (each one call or two of ``corral.AsyncClient``) and
``server.py`` builds the official SDK's server from them and runs it over stdio or
streamable HTTP.
"""
