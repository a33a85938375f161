"""The gateway simulator (StackZap, ZAP API, Meta Cloud API) and the tests' fault tools."""
