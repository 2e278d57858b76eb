//! The kernel's events for the front end: [`weft_lang::EventResolver`] over tracefs
//! (`weft_kernel::tracefs`), for `tracepoint:` probes, their `args`, and the
//! messages about kernel probes the running kernel does not offer.

use std::sync::OnceLock;

use weft_kernel::tracefs::{self, FieldKind, Tracefs, Tracepoint};
use weft_lang::{EventField, EventFieldShape, EventResolver, KernelOffers};

/// tracefs, found when first needed (a program without kernel probes never looks).
#[derive(Default)]
pub struct TracefsEvents {
    fs: OnceLock<Result<Tracefs, String>>,
}

impl TracefsEvents {
    fn fs(&self) -> Result<&Tracefs, String> {
        self.fs
            .get_or_init(|| Tracefs::find().map_err(|e| e.to_string()))
            .as_ref()
            .map_err(Clone::clone)
    }
}

impl EventResolver for TracefsEvents {
    fn tracepoints(&self, category: &str, name: &str) -> Result<Vec<(String, String)>, String> {
        let found = self
            .fs()?
            .matching(category, name)
            .map_err(|e| e.to_string())?;
        Ok(found.into_iter().map(|t| (t.category, t.name)).collect())
    }

    fn fields(&self, category: &str, name: &str) -> Result<Vec<EventField>, String> {
        let tp = Tracepoint {
            category: category.to_string(),
            name: name.to_string(),
        };
        let format = self.fs()?.format(&tp).map_err(|e| e.to_string())?;
        Ok(format
            .fields
            .into_iter()
            .map(|f| EventField {
                name: f.name,
                c_type: f.c_type,
                offset: f.offset,
                size: f.size,
                signed: f.signed,
                shape: match f.kind {
                    FieldKind::Scalar => EventFieldShape::Scalar,
                    FieldKind::Pointer => EventFieldShape::Pointer,
                    FieldKind::Array { dims } => EventFieldShape::Array { dims },
                    FieldKind::DataLoc => EventFieldShape::DataLoc,
                },
            })
            .collect())
    }

    fn kernel(&self) -> KernelOffers {
        let f = tracefs::features();
        KernelOffers {
            tracefs: f.tracefs.map(|p| p.display().to_string()),
            kprobes: f.kprobes.is_some(),
            btf: f.btf.is_some(),
        }
    }
}
