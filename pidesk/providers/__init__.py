"""Model providers behind one streaming protocol (``providers.base.Provider``)."""
