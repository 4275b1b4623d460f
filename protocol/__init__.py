"""MRC's wire format as constants and layouts (``headers``): what the transport sends and what the
controller's queue plan and the data planes size and trim, from one place."""
