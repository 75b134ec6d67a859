"""Reading a reflection back from its histories: collect and export them (`histories`), replay them (`replay`).

Nothing here runs inside a workflow. Submodules are imported by name (`reflector.client.audit.histories`), so
importing the package costs nothing.
"""
