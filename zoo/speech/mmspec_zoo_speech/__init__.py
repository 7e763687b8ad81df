"""mmspec's toy speech models, as data: `mmspec.zoo` finds them in this package's `models/` folder."""
