"""mmspec's toy vision models, as data: `mmspec.zoo` finds them in this package's `models/` folder."""
